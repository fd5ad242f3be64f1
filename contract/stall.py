"""The learner's last stall, as it publishes it in its state hash (``Keys.learner_state``).

A stall is a state in which the learner makes no training progress (its reasons:
``gspo_rl.learner.runtime.progress.STALL_REASONS``). Each time the learner warns about one it writes
``stall_reason``, ``stall_detail`` (at most ``MAX_DETAIL`` characters), ``stall_at`` (Unix time
of the warning) and ``stall_for_s`` (how long it had lasted then); when it ends,
``stall_ended_at``. The fields stay after the stall ends: they say what the last one was.
Readers (the server's dashboard) take them with ``LastStall.from_hash``; a learner that never
stalled, or one older than these fields, has none (None).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

FIELD_STALL_REASON = "stall_reason"
FIELD_STALL_DETAIL = "stall_detail"
FIELD_STALL_AT = "stall_at"
FIELD_STALL_FOR_S = "stall_for_s"
FIELD_STALL_ENDED_AT = "stall_ended_at"
MAX_DETAIL = 1000


def stall_fields(reason: str, detail: str, at: float, for_s: float) -> dict[str, str]:
    """The hash fields of a stall being reported (its end not known yet: empty)."""
    return {FIELD_STALL_REASON: reason, FIELD_STALL_DETAIL: detail[:MAX_DETAIL],
            FIELD_STALL_AT: repr(float(at)), FIELD_STALL_FOR_S: repr(round(float(for_s), 3)),
            FIELD_STALL_ENDED_AT: ""}


def stall_end_fields(at: float) -> dict[str, str]:
    """The hash field that says the last stall ended at ``at`` (Unix time)."""
    return {FIELD_STALL_ENDED_AT: repr(float(at))}


@dataclass(frozen=True)
class LastStall:
    reason: str
    detail: str
    at: float
    for_s: float
    ended_at: float | None

    @classmethod
    def from_hash(cls, raw: Mapping[bytes, bytes] | Mapping[str, str]
                  | Mapping[bytes | str, bytes | str]) -> LastStall | None:
        """From ``HGETALL Keys.learner_state`` (bytes or str); None without a stall."""
        d = {(k.decode() if isinstance(k, bytes) else k):
             (v.decode(errors="replace") if isinstance(v, bytes) else v)
             for k, v in raw.items()}
        reason = d.get(FIELD_STALL_REASON, "")
        at = _float(d.get(FIELD_STALL_AT))
        if not reason or at is None:
            return None
        return cls(reason=reason[:64], detail=d.get(FIELD_STALL_DETAIL, "")[:MAX_DETAIL],
                   at=at, for_s=_float(d.get(FIELD_STALL_FOR_S)) or 0.0,
                   ended_at=_float(d.get(FIELD_STALL_ENDED_AT)))


def _float(raw: str | None) -> float | None:
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None
