"""Data-parallel training under ``torchrun``: the collectives (``distributed``), FSDP2
sharding (``fsdp``), what rank 0 tells the others (``protocol``) and what they do
(``follower``)."""
