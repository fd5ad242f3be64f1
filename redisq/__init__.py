"""The Redis implementation of the protocol between the rollout servers and the learner.

Both sides import it; it imports the contract (``gspo_rl.contract``) and nothing else of the
project. The keys and records it stores are the contract's (``gspo_rl.contract.schema``), and
so are the reasons a request is refused (``gspo_rl.contract.errors``). What lives where:

- ``lua``: how a Lua script declares its named keys and arguments;
- ``connection``: the lean, auto-pipelining connection of the servers' hot path;
- ``errors``: the scripts' replies read as ``StoreError`` refusals;
- ``groups``: a group's life on the server side: opened, rollouts recorded, rewarded,
  published to the ready stream exactly once, or dropped or expired;
- ``episodes``: multi-turn episodes, grown one model turn at a time;
- ``ready``: the ready stream's entries and the learner's side of it (delivery, claims,
  acknowledgement and trimming, staleness along the learner's resumes);
- ``inflight``: the facts the admission bound counts, read in one round trip;
- ``registry``: the signed registrations and heartbeats of the rollout servers;
- ``tasks``: per-task statistics (how each task's recent groups ended);
- ``evals``: evaluation results, posted through a server, logged by the learner.

docs/concepts/life-of-a-group.md tells the life of a group across these modules.
"""
