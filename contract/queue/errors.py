"""What the Redis layer reports when it refuses a request: a storage-level reason, a
machine-readable code and a message. No HTTP here: ``gspo_rl.server.api.errors`` alone maps a
reason (a refused reward item's included) to an HTTP status, so the stores can be used, and
read, without the API.
"""

from __future__ import annotations

import enum
from typing import Any

from gspo_rl.contract.queue.schema import RolloutRecord


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


_CLOSED_STATUS = {"expired": "expired", "gone": "expired"}


def record_error(res: str | None, record: RolloutRecord) -> StoreError | None:
    if res in ("created", "updated"):
        return None
    rid, gid = record.rollout_id, record.group_id
    errors = {
        "unknown_group": (StoreReason.NOT_FOUND, f"unknown group {gid!r}"),
        "group_closed": (StoreReason.GONE, f"group {gid!r} no longer accepts rollouts"),
        "rollout_rewarded": (StoreReason.CONFLICT, f"rollout {rid!r} already has a reward"),
        "rollout_in_other_group": (StoreReason.CONFLICT,
                                   f"rollout {rid!r} belongs to another group"),
        "group_full": (StoreReason.CONFLICT, f"group {gid!r} already has all its rollouts"),
        "group_sealed": (StoreReason.CONFLICT,
                         f"group {gid!r} was recorded whole when sampled: it takes no "
                         "rollout on its own"),
        "group_exists": (StoreReason.CONFLICT, f"group {gid!r} already exists"),
        "no_data": (StoreReason.UNAVAILABLE,
                    f"rollout {rid!r} was not staged (Redis lost it): retry"),
    }
    if res in errors:
        reason, message = errors[res]
        return StoreError(reason, res, message)
    return None


def item_status(script_status: str, applied: bool) -> str:
    if script_status == "ok":
        return "stored" if applied else "not_applied"
    if script_status == "duplicate":
        return "duplicate" if applied else "not_applied"
    if script_status.startswith("closed:"):
        state = script_status.split(":", 1)[1]
        return _CLOSED_STATUS.get(state, "closed")
    return script_status
