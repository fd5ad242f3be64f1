"""The RL algorithm as pure functions of tensors: the policy losses (GSPO, GSPO-token, GRPO,
SAPO: ``losses``) and the advantages they train on (``advantages``)."""
