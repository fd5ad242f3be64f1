"""What the Redis layer reports when it refuses a request: a storage-level reason, a
machine-readable code and a message. No HTTP here: ``server.errors`` alone maps a reason (and a
reward item's outcome) to an HTTP status, so the stores can be used, and read, without the API.
"""

from __future__ import annotations

import enum
from typing import Any


class StoreReason(enum.Enum):
    """Why the store refused (the HTTP status each maps to is in ``server.errors``)."""

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
