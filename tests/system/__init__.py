"""Cross-process system tests: a real Redis, rollout servers, environments and learners, each in
its own process, through crashes and restarts."""
