"""``gspo sft``: a supervised warm start on chat demonstrations with the learner's machinery:
its configuration (``config``, torch-free), demonstrations laid out as the tokens an RL
episode records (``data``) and the training loop (``train``)."""
