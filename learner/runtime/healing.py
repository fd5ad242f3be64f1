"""Restarted rollout servers get the weights again, without a person.

A server that restarts comes back at policy version 0 while the learner is far ahead: every
group it samples is then too stale to train, no step is trained, so no push would ever come.
``ServerHealer.check`` (called by the loop every iteration, acting every ``interval_s``) reads
the registry (only verified entries, ``gspo_rl.redisq.registry``), and when a live server's
heartbeat reports a version older than the last push, pushes again, also while nothing is trained.
It names the states without progress it sees: ``no_servers``, and ``servers_behind`` when that
push fails (``gspo_rl.learner.runtime.progress``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

import redis

from gspo_rl.contract.schema import Keys
from gspo_rl.learner.runtime.progress import ProgressMonitor
from gspo_rl.redisq.registry import read_registry

log = logging.getLogger(__name__)


class ServerHealer:
    """Every ``interval_s`` (longer than the heartbeat interval, so versions have settled
    after a push): push to servers behind the last push."""

    def __init__(self, client: redis.Redis, keys: Keys, admin_key: str | None,
                 progress: ProgressMonitor, interval_s: float = 5.0) -> None:
        self.client, self.keys, self.admin_key = client, keys, admin_key
        self.progress, self.interval_s = progress, interval_s
        self.last_check = 0.0
        self.rejected = 0  # registry entries skipped at the last read (a check or a push)

    def pushed(self, rejected: Collection[str] | None = None) -> None:
        """A push just happened: heartbeats need a few seconds to show its version.
        ``rejected``: the registry entries that push skipped (None: it did not read)."""
        self.last_check = time.monotonic()
        if rejected is not None:  # the push read the registry: the check would not now
            self.rejected = len(rejected)

    def due(self) -> bool:
        return time.monotonic() - self.last_check >= self.interval_s

    def check(self, pushed_version: int, version: int, push: Callable[[], bool]) -> None:
        """Raises ``redis.RedisError`` when Redis does not answer (the loop retries)."""
        if not self.due():
            return
        self.last_check = time.monotonic()
        reg = read_registry(self.client, self.keys, self.admin_key, for_push=True)
        self.rejected = len(reg.rejected)
        if not reg.servers:
            self.progress.stalled("no_servers", f"no live verified server registered "
                                  f"({len(reg.rejected)} entries rejected)")
            return
        self.progress.clear("no_servers")
        behind = [s for s in reg.servers if 0 <= s.policy_version < pushed_version]
        if not behind:
            self.progress.clear("servers_behind")
            return
        log.info("servers %s are behind version %d: pushing",
                 [f"{s.server_id}@{s.policy_version}" for s in behind], pushed_version)
        if not push():
            ids = [s.server_id for s in behind]
            self.progress.stalled("servers_behind", f"learner at version {version}, "
                                  f"servers {ids} behind it; the push failed")
