"""What a run does when a group fails: retry it, abandon it, or stop; and the counts.

A failed group is one whose episode (or sampling, or reward posting) raised: a 400 for a
message the server cannot render, a 409 from ``episode_history_rewrite="reject"``, a tool that
crashed, a scoring function that raised. One such group must not end an hours-long collection,
and an error must never become a reward. So, by ``FailurePolicy.on_error``:

- ``"retry"`` (default): play the same task again as a new group, up to ``max_retries`` times,
  then abandon it;
- ``"abandon"``: drop the group at once;
- ``"raise"``: stop the run with the error (the old behaviour; for debugging).

A failed group posts no reward: the SDK gives it up on the server
(``POST /v1/groups/{id}/abandon``: published with the rewards it has when it has enough,
else dropped, counted there as ``abandoned``), so it holds no admission capacity while the
task is retried (a server it cannot reach releases it once idle, ``queue.group_idle_s``).
Every failure is logged (WARNING) and counted in ``RunStats``; ``max_consecutive_failures``
groups failing in a row stop the run anyway: that is a broken environment or server, not a
bad episode.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

log = logging.getLogger("gspo_rl.client.environment")


@dataclass(frozen=True)
class FailurePolicy:
    on_error: Literal["retry", "abandon", "raise"] = "retry"
    max_retries: int = 1
    """Extra attempts of a failed group's task (``on_error="retry"``) before abandoning it."""
    max_consecutive_failures: int = 20
    """Stop the run (raise the last error) after this many failed attempts in a row."""

    def __post_init__(self) -> None:
        if self.on_error not in ("retry", "abandon", "raise"):
            raise ValueError(f"on_error must be retry | abandon | raise, got {self.on_error!r}")
        if self.max_retries < 0 or self.max_consecutive_failures < 1:
            raise ValueError("max_retries must be >= 0 and max_consecutive_failures >= 1")


@dataclass
class RunStats:
    """Counts of one run. ``errors``: failed attempts by kind (``describe_error``)."""

    completed: int = 0
    failed_attempts: int = 0
    retried: int = 0
    abandoned: int = 0
    consecutive_failures: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    resampled: int = 0
    """Tasks played again because the server dropped their group for equal rewards."""
    equal_rewards_kept: int = 0
    """Tasks whose last group was still dropped for equal rewards (resampling exhausted)."""

    def summary(self) -> str:
        kinds = ", ".join(f"{k}: {n}" for k, n in self.errors.most_common())
        resampled = (f"; {self.resampled} resampled for equal rewards "
                     f"({self.equal_rewards_kept} still equal)" if self.resampled else "")
        return (f"{self.completed} groups completed, {self.failed_attempts} failed attempts "
                f"({self.retried} retried, {self.abandoned} groups abandoned)" + resampled
                + (f"; errors: {kinds}" if kinds else ""))


def describe_error(exc: BaseException) -> str:
    """A short kind for counting: the class, the HTTP status and the server's error code
    when the exception carries them (openai's ``APIStatusError``, the SDK's ``GSPOError``)."""
    status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
    body = getattr(exc, "body", None)
    code = getattr(exc, "code", None)
    if code is None and isinstance(body, dict):
        error = body.get("error")
        inner = error if isinstance(error, dict) else body
        code = inner.get("code")
    parts = [type(exc).__name__] + [str(p) for p in (status, code) if p]
    return " ".join(parts)


def record_failure(stats: RunStats, policy: FailurePolicy, exc: Exception, attempt: int,
                   task_repr: str) -> bool:
    """Count a failed attempt; True: try the task again. Raises ``exc`` when the policy says
    stop (``raise``, or too many failures in a row)."""
    stats.failed_attempts += 1
    stats.consecutive_failures += 1
    stats.errors[describe_error(exc)] += 1
    if policy.on_error == "raise":
        raise exc
    if stats.consecutive_failures >= policy.max_consecutive_failures:
        log.error("%d group attempts failed in a row: stopping the run (%s)",
                  stats.consecutive_failures, stats.summary())
        raise exc
    again = policy.on_error == "retry" and attempt < policy.max_retries
    log.warning("group of task %s failed (attempt %d): %s: %s; %s", task_repr, attempt + 1,
                describe_error(exc), exc, "retrying" if again else "abandoned")
    if again:
        stats.retried += 1
    else:
        stats.abandoned += 1
    return again
