"""What a store reports when it refuses a request: a storage-level reason, a machine-readable
code and a message. The Redis stores (``gspo_rl.redisq``) raise them (``gspo_rl.redisq.errors``
reads their scripts' replies into them); no HTTP here: ``gspo_rl.server.api.errors`` alone maps
a reason (a refused reward item's included) to an HTTP status, so the stores can be used, and
read, without the API.
"""

from __future__ import annotations

import enum
from typing import Any


class StoreReason(enum.Enum):
    """Why the store refused (the HTTP status each maps to is in ``gspo_rl.server.api.errors``)."""

    NOT_FOUND = "not_found"
    """The group, rollout or episode does not exist (never created, or its records expired)."""
    CONFLICT = "conflict"
    """The request contradicts what is stored (another size, a reward already there, ...)."""
    GONE = "gone"
    """The group existed but no longer accepts this (finalised or expired)."""
    INVALID = "invalid"
    """The request is out of the store's bounds (e.g. a group size over the maximum)."""
    UNAVAILABLE = "unavailable"
    """Redis lost data the request relied on: nothing was stored, retrying is safe."""


class StoreError(Exception):
    """A request the store refuses: ``reason`` (a ``StoreReason``), ``code`` (a short name the
    client sees, e.g. ``group_exists``), a human ``message`` and optional JSON ``details``
    (e.g. every item's outcome of a batch that failed as a whole)."""

    def __init__(self, reason: StoreReason, code: str, message: str,
                 details: Any = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code
        self.message = message
        self.details = details
