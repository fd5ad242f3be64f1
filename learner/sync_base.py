"""The seam between the training loop and the weight broadcast.

The loop only knows ``WeightSync``: after every ``sync_every`` steps it calls
``push(model, version)`` and records the report. ``learner.weight_sync.BroadcastSync``
(torch.distributed broadcast to every registered rollout server) satisfies it structurally;
``NoSync`` is the choice when no server needs the weights (offline training, tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


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
    """Pushes nothing: the servers keep their weights (or there are none)."""

    def push(self, model: torch.nn.Module, version: int) -> NoSyncReport:
        return NoSyncReport(version=version)

    def close(self) -> None:
        return None
