"""The learner's checkpoints: saving and loading a run's state (``store``) and exporting a
trained policy for serving (``export``)."""
