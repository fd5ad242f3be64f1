"""The wire contract between the rollout servers and the learner: what both sides must agree on.

``schema``: every Redis key name and the records stored under them (``Keys``, ``RolloutRecord``,
``ReadyGroup``: their Redis implementation, the stores and the reader, is ``gspo_rl.redisq``);
``errors``: the reasons a store refuses a request; ``credit``: the credit rule the server
publishes and the learner trains on, and ``turn_advantages``, that rule per model turn of a
ready group; ``admission``: the bound on groups in flight; ``sampling_dist``: the sampling
distribution both samplers and the learner use; ``stall``: the learner's last stall as the
dashboard reads it; ``weights``: the weight broadcast's data plane (collective, CUDA IPC, LoRA);
``chat``: messages and turns; and the few helpers both processes share, here because the
server and the learner may not import each other (``attention``, ``gc_freeze``; ``net``, which
``weights`` uses too). It imports no other package of the project
(tests/checks/test_import_graph.py), so either side can be read and installed without the other.
"""
