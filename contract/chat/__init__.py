"""Chat templating that the rollout server and the learner's supervised warm start share:
messages into the form templates read (``messages``), rendering to token ids with control
tokens in messages encoded as text (``sanitize``), and where a model's turn ends in a
conversation's tokens (``turns``)."""
