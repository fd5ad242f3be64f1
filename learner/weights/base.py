"""The seam between the training loop and the weight broadcast.

The loop only knows ``WeightSync``: after every ``sync_every`` steps it calls
``push(model, version)`` and records the report. ``gspo_rl.learner.weights.broadcast.BroadcastSync``
(torch.distributed broadcast to every registered rollout server) satisfies it structurally;
``NoSync`` is the choice when no server needs the weights (offline training, tests).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import redis
import torch

from gspo_rl.contract.schema import Keys
from gspo_rl.redisq.registry import live_servers

log = logging.getLogger(__name__)


class SyncReport(Protocol):
    """What a push reports; the loop logs these fields."""

    version: int
    ok: bool  # every live server now serves ``version``
    seconds: float
    bytes_sent: int


@runtime_checkable
class WeightSync(Protocol):
    """Sends the learner's weights to the rollout servers."""

    def push(self, model: torch.nn.Module, version: int) -> SyncReport:
        """Make every live server serve ``model``'s weights as policy ``version``. Bounded in
        time; a failure is reported (``ok=False``), not raised, so training goes on."""
        ...

    def close(self) -> None:
        """Release connections and process groups."""
        ...


@dataclass
class NoSyncReport:
    version: int
    ok: bool = True
    seconds: float = 0.0
    bytes_sent: int = 0


class NoSync:
    """Pushes nothing: the servers keep their weights (or there are none). Given the Redis
    client and keys, it checks the server registry at start and on every push: a live server
    then samples from weights the learner has moved past, which is loud (WARNING, and the
    push reports ``ok=False`` so every step line says so)."""

    def __init__(self, client: redis.Redis | None = None, keys: Keys | None = None) -> None:
        self.client, self.keys = client, keys
        n = self._live()
        if n:
            log.warning("weight_sync is 'none' but %d rollout server(s) are registered: they "
                        "will keep sampling from their initial weights while this learner "
                        "trains (start it with --weight-sync broadcast)", n)

    def _live(self) -> int:
        if self.client is None or self.keys is None:
            return 0
        try:
            return len(live_servers(self.client, self.keys))
        except redis.RedisError:
            return 0

    def push(self, model: torch.nn.Module, version: int) -> NoSyncReport:
        n = self._live()
        if n:
            log.warning("learner at version %d pushes no weights (weight_sync 'none'): %d "
                        "registered server(s) are behind", version, n)
        return NoSyncReport(version=version, ok=not n)

    def close(self) -> None:
        return None
