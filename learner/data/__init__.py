"""Data intake of the learner: ready groups into minibatches and padded or packed
microbatches (``batching``, ``packing``). Pure: numpy and torch on the CPU, no I/O (the groups
come from ``gspo_rl.redisq.ready.reader``)."""
