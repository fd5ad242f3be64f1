"""The wire contract between the rollout servers and the learner: what both sides must agree on.

Redis keys and records (``redis_schema``), the signed server registry (``registry``), the weight
broadcast's data plane (``weight_transport``, ``cuda_ipc``), the credit rule the server publishes
and the learner trains on (``credit``) and the sampling distribution both samplers and the learner
use (``sampling_dist``). It imports neither ``server`` nor ``learner``
(tests/test_import_graph.py), so either side can be read and installed without the
other.
"""
