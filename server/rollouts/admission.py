"""Admission control: a new group starts only if it can be trained within the learner's
staleness bound; otherwise the request is held, then refused.

The rule (``gspo_rl.contract.admission``): with ``n`` groups in flight (summed over every
server from facts in Redis, ``gspo_rl.redisq.inflight``) a new group is admitted when
``n + 1 <= (max_staleness + 1 - lag) * groups_per_step``, the learner's published parameters,
``lag`` the learner's version minus this server's; until a learner has published them the
bound is ``admission_capacity_without_learner``; a learner without ``max_staleness`` sets none.

At the bound the request is held (re-checked every ``POLL_S`` and whenever one of this
server's groups leaves) for at most ``admission_wait_s``, then refused with 503
``too_many_groups_in_flight`` and ``Retry-After``; with no learner connected (its heartbeat,
``learner_connected``) nothing would free a place, so the request is refused at once, 503
``no_learner_connected``, saying so. Routes that start a group:
``POST /v1/completions``, ``/v1/rollouts``, ``/v1/chat/completions`` without a
``rollout_id``, ``POST /v1/groups``; work already accepted is never held. Concurrent requests
share one read of the facts (``AdmissionGate.snapshot``). A learner that has met its goal
(``finished`` in its state) makes every such route answer 503 ``training_finished``. The
ready-queue bound (``max_ready_groups``, 503 ``ready_queue_full``) is an independent limit.
Why the server decides, and the metrics: docs/design/admission.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable

from gspo_rl.contract.admission import learner_connected, no_learner_text
from gspo_rl.redisq.inflight import InFlightCounter, Snapshot
from gspo_rl.server.config import ServerSettings
from gspo_rl.server.metrics import ServerMetrics
from gspo_rl.server.rollouts.errors import RolloutError, unavailable

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5
ADMISSION_RETRY_AFTER_S = 1
NO_LEARNER_RETRY_AFTER_S = 2
POLL_S = 0.05
WARN_EVERY_S = 10.0
FINISHED_RETRY_AFTER_S = 10
FINISHED_WARN_EVERY_S = 60.0
NO_SIGNAL_HINT = ("sample harder or easier tasks: task selection by difficulty, docs/tasks.md; "
                  "each such group counts as in flight until the next learner step, "
                  "no_signal_hold_s")


class AdmissionGate:
    """Holds new groups back at the in-flight bound and at the ready-queue bound."""

    def __init__(self, counter: InFlightCounter, settings: ServerSettings,
                 metrics: ServerMetrics, server_version: Callable[[], int | None],
                 weight_status: Callable[[], str] = lambda: "") -> None:
        """``weight_status``: an update under way or failed (``WeightUpdates.describe``),
        named in the refusals while this server is behind the learner."""
        self.counter = counter
        self.enabled = settings.admission
        self.wait_s = settings.admission_wait_s
        self.fallback = settings.admission_capacity_without_learner
        self.drought_s = settings.no_signal_drought_s
        self.holding = 0  # requests held at the bound now (the admission_held gauge)
        self.max_ready_groups = settings.max_ready_groups
        self.metrics = metrics
        self.server_version = server_version
        self.weight_status = weight_status
        self.local = 0  # admitted here, request still being served
        self._snap: Snapshot | None = None
        self._snap_at = -math.inf  # when the cached read started
        self._gen = 0  # bumped by ``release``: reads started before it are out of date
        self._snap_gen = -1
        self._reading: asyncio.Future[Snapshot] | None = None  # the shared read under way
        self._reading_gen = -1
        self._changed = asyncio.Event()  # set (and replaced) when one of our groups leaves
        self._last_warning = -WARN_EVERY_S

    async def snapshot(self, max_age_s: float = POLL_S) -> Snapshot:
        """The in-flight facts, re-read when older than ``max_age_s`` or read before the
        last ``release``. Concurrent callers share one read (a burst of requests costs one
        round of Redis calls, not one each); ``max_age_s=0`` always starts its own."""
        now = time.monotonic()
        if (self._snap is not None and self._snap_gen == self._gen
                and now - self._snap_at <= max_age_s):
            return self._snap
        task = self._reading
        if max_age_s <= 0 or task is None or task.done() or self._reading_gen != self._gen:
            task = asyncio.ensure_future(self._read(self._gen, now))
            task.add_done_callback(_retrieve)  # its callers may all have left
            self._reading, self._reading_gen = task, self._gen
        return await asyncio.shield(task)  # a cancelled caller does not cancel the others'

    async def _read(self, gen: int, started: float) -> Snapshot:
        snap = await self.counter.read()
        if started >= self._snap_at:  # a newer read may have finished first
            self._snap, self._snap_at, self._snap_gen = snap, started, gen
            self.metrics.ready_queue_depth.set(snap.ready_depth)
        return snap

    async def refresh_gauges(self) -> None:
        """Re-read the facts and set the gauges (``/metrics``)."""
        snap = await self.snapshot(max_age_s=0.0)
        bound = self.bound(snap)
        self.metrics.groups_in_flight.set(snap.others + snap.budget_counted(bound) + self.local)
        self.metrics.admission_bound.set(-1 if bound is None else bound)

    def bound(self, snap: Snapshot) -> int | None:
        version = self.server_version()
        if version is None:
            version = snap.learner.version
        return snap.learner.bound(version, self.fallback)

    async def admit(self, route: str) -> bool:
        """Returns once the request may start a group (True: counted, call ``release``);
        raises 503 at the ready-queue bound or after ``admission_wait_s`` held. A cached
        read (at most ``POLL_S`` old) may admit; holding or refusing needs a fresh one."""
        if not self.enabled:
            snap = await self.snapshot()
            self._check_finished(snap, route)
            if self._ready_full(snap):
                self._check_ready_queue(await self.snapshot(max_age_s=0.0), route)
            return False
        deadline = time.monotonic() + self.wait_s
        held, fresh = False, False
        try:
            while True:
                changed, gen = self._changed, self._gen
                snap = await self.snapshot(max_age_s=0.0 if fresh else POLL_S)
                self._check_finished(snap, route)
                # _try is synchronous: count and decision cannot interleave with another's.
                # Groups released while the read was on its way left ``local`` and may be
                # missing from the read: they are counted again (never admit past the bound).
                if not self._ready_full(snap) and self._try(snap, self._gen - gen):
                    return True
                if not fresh:
                    fresh = True
                    continue
                self._check_ready_queue(snap, route)
                if not learner_connected(snap.learner_age_s):
                    raise self._refuse_no_learner(snap, route)
                if not held:
                    held = True
                    self.holding += 1
                    self.metrics.admission_held.inc()
                    self.metrics.admission_waited.inc()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._refuse(snap, route)
                with contextlib.suppress(TimeoutError):  # woken by a release, or re-polls
                    await asyncio.wait_for(changed.wait(), min(POLL_S, remaining))
        finally:
            if held:
                self.holding -= 1
                self.metrics.admission_held.dec()

    def _try(self, snap: Snapshot, released_since: int) -> bool:
        """Counts the request in if one more group fits. ``released_since``: this server's
        groups released after ``snap``'s read began (in Redis by now, perhaps not in it)."""
        bound = self.bound(snap)
        in_flight = snap.others + snap.budget_counted(bound) + self.local + released_since
        self.metrics.groups_in_flight.set(in_flight)
        self.metrics.admission_bound.set(-1 if bound is None else bound)
        if bound is not None and in_flight + 1 > bound:
            return False
        self.local += 1
        return True

    async def release(self) -> None:
        """An admitted request ended: its group is in Redis now (or never will be)."""
        self.local = max(0, self.local - 1)
        self._gen += 1  # its group moved into the facts: read them again
        self._changed.set()
        self._changed = asyncio.Event()

    def _refuse(self, snap: Snapshot, route: str) -> RolloutError:
        self.metrics.admission_refused.labels(route).inc()
        bound = self.bound(snap)
        made_of = f"{snap.describe()}, {self.local} being sampled here"
        lag = snap.learner.version - (self.server_version() or 0)
        if snap.learner.known and lag > 0:  # the bound shrinks with the lag
            made_of += (f"; this server is {lag} version(s) behind the learner: the bound "
                        "grows back when the learner's weights arrive here")
            if status := self.weight_status():
                made_of += f" ({status})"
        held = snap.budget_counted(bound)
        counted = snap.others + held + self.local
        if not learner_connected(snap.learner_age_s):
            made_of = f"{no_learner_text(snap.learner_age_s)}; {made_of}"
        if held < snap.no_signal:
            made_of += (f"; the sampling budget counts {held} of the {snap.no_signal} without "
                        "a learning signal, leaving one learner step's groups free")
        elif snap.in_drought:
            made_of += (f"; no group has carried a learning signal for {self.drought_s:g} s "
                        f"({snap.drought} ended without one): the sampling budget counts all "
                        f"{held} until one does (no_signal_drought_s)")
        if held * 2 >= counted > 0:
            made_of += (f"; most are groups without a learning signal: the policy solves or "
                        f"fails every sample of most tasks it is given ({NO_SIGNAL_HINT})")
        self._warn(f"{counted} groups in flight ({made_of}; bound {bound}, "
                   f"learner at version {snap.learner.version}): refusing new groups on "
                   f"{route} after holding them {self.wait_s:g} s, until these groups end "
                   "(trained, rewards posted, abandoned, or idle for group_idle_s)")
        return unavailable(
            f"{counted} groups are in flight ({made_of}), at the bound of "
            f"{bound} that the learner's staleness limit allows; this request waited "
            f"{self.wait_s:g} s for them to end (admission_wait_s): retry",
            code="too_many_groups_in_flight", retry_after_s=ADMISSION_RETRY_AFTER_S)

    def _refuse_no_learner(self, snap: Snapshot, route: str) -> RolloutError:
        """At the bound with no learner connected: no group in flight will be trained, so
        holding the request helps nothing; refused at once, saying so."""
        self.metrics.admission_refused.labels(route).inc()
        bound = self.bound(snap)
        counted = snap.others + snap.budget_counted(bound) + self.local
        said = no_learner_text(snap.learner_age_s)
        self._warn(f"{said}; {counted} groups in flight ({snap.describe()}; bound {bound}): "
                   f"refusing new groups on {route} until a learner connects")
        return unavailable(
            f"{said}. {counted} groups are in flight ({snap.describe()}, {self.local} being "
            f"sampled here), at the bound of {bound}; none is trained without a learner, so "
            "this server starts no new group until one connects (then retry)",
            code="no_learner_connected", retry_after_s=NO_LEARNER_RETRY_AFTER_S)

    def _check_finished(self, snap: Snapshot, route: str) -> None:
        """503 ``training_finished`` once the learner has met its goal (``finished`` in its
        state, e.g. its target reward): a group started now would never be trained. Lifted
        when a learner starts again (it publishes an empty ``finished``)."""
        why = snap.learner.finished
        if not why:
            return
        self.metrics.admission_refused.labels(route).inc()
        self._warn(f"the learner finished training ({why}): refusing new groups on {route} "
                   "until a learner starts again", every_s=FINISHED_WARN_EVERY_S)
        raise unavailable(f"the learner finished training ({why}); this server starts no "
                          "new group until a learner starts again (then retry)",
                          code="training_finished",
                          retry_after_s=FINISHED_RETRY_AFTER_S)

    def _ready_full(self, snap: Snapshot) -> bool:
        return 0 < self.max_ready_groups <= snap.undelivered

    def _check_ready_queue(self, snap: Snapshot, route: str) -> None:
        """503 ``ready_queue_full`` while ``max_ready_groups`` or more published groups wait
        for the learner to read them. (Not the stream's length: entries the learner dropped
        stale are acknowledged but stay until its next trim, and counting them refused new
        groups while the learner had nothing left to train.)"""
        if not self._ready_full(snap):
            return
        self.metrics.ready_queue_refused.labels(route).inc()
        self._warn(f"ready queue holds {snap.undelivered} unread groups (bound "
                   f"{self.max_ready_groups}): refusing new groups on {route} until the "
                   "learner catches up")
        raise unavailable(f"the ready queue holds {snap.undelivered} unread groups, at this "
                          f"server's bound of {self.max_ready_groups} (max_ready_groups): "
                          "the learner is behind; retry later", code="ready_queue_full",
                          retry_after_s=RETRY_AFTER_S)

    def _warn(self, message: str, every_s: float = WARN_EVERY_S) -> None:
        now = time.monotonic()
        if now - self._last_warning >= every_s:  # every request is refused: log sparsely
            self._last_warning = now
            log.warning("%s", message)


def _retrieve(task: asyncio.Future[Snapshot]) -> None:
    if not task.cancelled():
        task.exception()
