"""The wire contract between the rollout servers and the learner: what both sides must agree on.

``queue``: the Redis protocol (keys and records, the stores and the reader, their Lua scripts,
the server registry, task statistics, evaluations); ``weights``: the weight broadcast's data
plane (collective, CUDA IPC, LoRA); ``chat``: messages and turns; ``credit``: the credit rule
the server publishes and the learner trains on; ``admission``: the bound on groups in flight;
``sampling_dist``: the sampling distribution both samplers and the learner use; ``stall``: the
learner's last stall as the dashboard reads it; and the few helpers both processes share
(``attention``, ``gc_freeze``, ``net``). It imports neither ``server`` nor ``learner``
(tests/test_import_graph.py), so either side can be read and installed without the other.
"""
