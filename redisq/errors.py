"""The Redis scripts' replies as the store's refusals (``gspo_rl.contract.errors``): a record
script's result -> a ``StoreError`` (or None when it stored), a reward script's item status ->
the status the item's ``RewardResult`` reports.
"""

from __future__ import annotations

from gspo_rl.contract.errors import StoreError, StoreReason
from gspo_rl.contract.schema import RolloutRecord

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
