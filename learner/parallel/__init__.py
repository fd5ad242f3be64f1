"""Data-parallel training under ``torchrun``: the collectives (``distributed``), FSDP2
sharding (``fsdp``) and what rank 0 tells the other ranks (``protocol``; what they do with it is
``gspo_rl.learner.follower``)."""
