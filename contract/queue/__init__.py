"""The Redis protocol between the rollout servers and the learner, in one package.

Both sides import it; it imports neither. What lives where:

- ``schema``: every key name (``Keys``, the only place that spells one) and the msgpack
  records stored under them (``RolloutRecord``, ``ReadyGroup``);
- ``lua``: how a Lua script declares its named keys and arguments;
- ``connection``: the lean, auto-pipelining connection of the servers' hot path;
- ``errors``: the storage-level reasons a request is refused (``StoreError``);
- ``groups``: a group's life on the server side: opened, rollouts recorded, rewarded,
  published to the ready stream exactly once, or dropped or expired;
- ``episodes``: multi-turn episodes, grown one model turn at a time;
- ``ready``: the ready stream's entries and the learner's side of it (delivery, claims,
  acknowledgement and trimming);
- ``inflight``: the facts the admission bound counts, read in one round trip;
- ``registry``: the signed registrations and heartbeats of the rollout servers;
- ``evals``: evaluation results, posted through a server, logged by the learner.

docs/concepts.md tells the life of a group across these modules.
"""
