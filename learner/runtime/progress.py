"""Why the learner is not training, said out loud, and bounded retries while Redis is down.

``ProgressMonitor`` names each state in which the loop makes no progress:

- ``redis_down``: Redis does not answer (the loop retries with back-off, see ``RedisRetry``);
- ``all_stale``: every group read was older than ``max_staleness`` and dropped;
- ``no_groups``: the ready stream is empty; the detail says why (``no_groups_detail``): the
  groups in flight and what they are made of (open ones waiting for rewards, idle ones), and
  whether they hold the servers' admission bound (servers then start no new group), or that
  nothing is in flight (no environment is producing, or none reaches a server);
- ``no_servers``: weight sync is on and no live, verified server is registered;
- ``servers_behind``: a live server serves an older policy than the learner pushed (it
  restarted), and pushing to it again failed;
- ``weight_push``: a weight push waits on a server (or a server on its part of the
  broadcast) past a few seconds; reported every few seconds while it lasts (the push
  paces these reports: ``gspo_rl.learner.weights.replies``).

Each state is logged at WARNING with its reason when it starts and then at most once per
``interval_s`` while it lasts (not once per loop iteration), written to the metrics JSONL as a
``{"event": "stall", ...}`` record, and counted into the next step record (``stalls``); with
``publish`` (what writes the learner's state hash), each warning and each end is also published
there (``gspo_rl.contract.stall``: the servers' dashboard shows the last stall and its cause).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from gspo_rl.contract.stall import stall_end_fields, stall_fields
from gspo_rl.learner.tracking.metrics import MetricsLogger
from gspo_rl.redisq.inflight import InFlightFacts

log = logging.getLogger(__name__)

STALL_REASONS = ("redis_down", "all_stale", "no_groups", "no_servers", "servers_behind",
                 "weight_push")


class RedisUnavailable(RuntimeError):
    """Redis stayed unreachable longer than the learner's bound (``redis_retry_s``)."""


class ProgressMonitor:
    """Tracks the no-progress states; ``stalled`` reports one, ``progressed`` ends them."""

    def __init__(self, metrics: MetricsLogger, interval_s: float = 30.0,
                 run_id: str = "",
                 publish: Callable[[dict[str, Any]], None] | None = None) -> None:
        """``publish``: writes fields to the learner's state hash (``publish_state``, which
        never raises on Redis errors); None: stalls are not published."""
        self.metrics, self.run_id = metrics, run_id
        self.publish = publish
        self.interval_s = interval_s
        self.since: dict[str, float] = {}  # reason -> when it started (monotonic)
        self._last_warned: dict[str, float] = {}
        self.counts: Counter[str] = Counter()  # since the last step record

    def stalled(self, reason: str, detail: str | Callable[[], str],
                every_s: float | None = None) -> None:
        """The loop made no progress this iteration, because of ``reason``; ``detail`` (or
        what it returns: computed only when a warning is due) says more. ``every_s``: the
        interval between warnings for this call (default ``interval_s``)."""
        if reason not in STALL_REASONS:
            raise ValueError(f"unknown stall reason {reason!r}")
        now = time.monotonic()
        start = self.since.setdefault(reason, now)
        self.counts[reason] += 1
        every = self.interval_s if every_s is None else every_s
        if now - self._last_warned.get(reason, -float("inf")) < every:
            return
        self._last_warned[reason] = now
        if callable(detail):
            detail = detail()
        log.warning("no training progress (%s) for %.0f s: %s", reason, now - start, detail)
        self.metrics.event({"event": "stall", "run_id": self.run_id, "reason": reason,
                            "detail": detail, "for_s": round(now - start, 3),
                            "time": time.time()})
        if self.publish is not None:
            self.publish(stall_fields(reason, detail, time.time(), now - start))

    def clear(self, reason: str) -> None:
        """``reason`` no longer holds (the next occurrence warns at once)."""
        start = self.since.pop(reason, None)
        self._last_warned.pop(reason, None)
        if start is not None:
            log.info("%s ended after %.0f s", reason, time.monotonic() - start)
            if self.publish is not None:
                self.publish(stall_end_fields(time.time()))

    def progressed(self) -> dict[str, Any]:
        """A step was trained: the states about the queue end (the server states end when a
        registry check says so: training on a backlog does not bring a server back). Returns
        the step record's ``stalls`` field (iterations per reason since the previous step)."""
        for reason in ("redis_down", "all_stale", "no_groups"):
            self.clear(reason)
        counts, self.counts = dict(self.counts), Counter()
        return {"stalls": counts}


def no_groups_detail(facts: InFlightFacts, bound: int | None) -> str:
    """Why the ready stream is empty, from the in-flight facts and the learner's admission
    bound (``gspo_rl.contract.admission.capacity`` at lag 0; None: no bound)."""
    n = facts.open + facts.complete + facts.undelivered + facts.remote_pending
    text = f"the ready stream is empty; {n} groups in flight ({facts.describe()})"
    if facts.no_signal and facts.no_signal >= n:
        return (f"the ready stream is empty: {facts.no_signal} groups ended since the last "
                "step, every one with equal rewards (no learning signal, dropped): the policy "
                "solves or fails every sample of the tasks it is given; the environment's "
                "log says which (sample other tasks: task selection by difficulty, "
                f"docs/tasks.md); {n} groups in flight ({facts.describe()})")
    if bound is not None and n >= bound:
        return (text + f": at the admission bound of {bound}, the servers start no new group "
                "until these end (their rewards posted, abandoned, idle for group_idle_s, or "
                "expired at their deadline)")
    if n > 0:
        return text + ": waiting for their rewards"
    if facts.idle:
        return text + ": the open groups are idle (their environment stopped posting)"
    return text + ": no environment is sampling (none runs, or none reaches a server)"


class RedisRetry:
    """Back-off between retries while Redis is down, and the bound after which to give up.

    ``failed`` sleeps (0.5 s, doubling, at most ``max_sleep_s``) and raises
    ``RedisUnavailable`` once the outage has lasted ``bound_s``; ``ok`` resets it.
    """

    def __init__(self, bound_s: float, max_sleep_s: float = 8.0) -> None:
        self.bound_s, self.max_sleep_s = bound_s, max_sleep_s
        self.down_since: float | None = None
        self._sleep = 0.5

    def failed(self, exc: Exception) -> None:
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = now
        down = now - self.down_since
        if down >= self.bound_s:
            raise RedisUnavailable(f"Redis unreachable for {down:.0f} s (bound "
                                   f"{self.bound_s:.0f} s): {exc}") from exc
        time.sleep(min(self._sleep, self.bound_s - down))
        self._sleep = min(self._sleep * 2, self.max_sleep_s)

    def ok(self) -> bool:
        """Redis answered; returns whether it had been down (the caller recovers)."""
        was_down = self.down_since is not None
        self.down_since, self._sleep = None, 0.5
        return was_down
