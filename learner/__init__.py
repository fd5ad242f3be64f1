"""The learner: pure losses, advantages, the training loop and the weight broadcast."""
