"""``DashboardService``: what ``GET /v1/dashboard/state`` shows, and the dashboard's memory.

One service per server process (``app.state.dashboard``, made in the app's lifespan). It
holds what Redis does not: the samples the rates come from (``history.History``) and the
recent groups (``recent.RecentGroups``). A read of the state costs three round trips to Redis
(``sources.read_sources``'s two and the admission gate's shared read of the in-flight facts,
at most 50 ms old) plus, at most once a second, the recent groups' read; everything in it
is bounded, nothing in it waits on the engine.
"""

from __future__ import annotations

import math
import time

from redis.asyncio import Redis

from gspo_rl.contract.admission import LearnerParams, learner_connected, no_learner_text
from gspo_rl.contract.schema import Keys
from gspo_rl.redisq.inflight import Snapshot
from gspo_rl.server.api.dashboard.history import History, Sample
from gspo_rl.server.api.dashboard.protocol import (
    DashboardState,
    EngineOut,
    LearnerOut,
    QueueOut,
    RewardSummary,
)
from gspo_rl.server.api.dashboard.recent import RecentGroups, refresh_quietly
from gspo_rl.server.api.dashboard.sources import (
    Sources,
    as_float,
    as_int,
    evals_out,
    fates_out,
    finished_totals,
    read_sources,
    servers_out,
    stall_out,
    trained_rewards,
)
from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.sampler import SamplingEngine
from gspo_rl.server.rollouts.admission import AdmissionGate

FACTS_MAX_AGE_S = 0.05  # the admission gate's own (POLL_S): a read it just made is shared


def activity(params: LearnerParams, age: float | None, facts: Snapshot | None) -> str:
    """What the learner does now, as the queue shows it."""
    if not learner_connected(age):
        return no_learner_text(age)
    if params.finished:
        return f"finished: {params.finished}"
    if params.training:
        return f"training a step of {params.training} groups"
    if facts is None:
        return "between steps"
    if facts.undelivered:
        return f"between steps: {facts.undelivered} published groups wait for it"
    return f"waiting for groups: the ready stream is empty ({facts.describe()})"


class DashboardService:
    """The dashboard's state reads (module docstring)."""

    def __init__(self, settings: ServerSettings, keys: Keys) -> None:
        self.settings = settings
        self.keys = keys
        self.history = History()
        self.recent = RecentGroups(keys)

    async def state(self, engine: SamplingEngine, redis: Redis,
                    gate: AdmissionGate | None) -> DashboardState:
        src = await read_sources(redis, self.keys)
        snap = await gate.snapshot(FACTS_MAX_AGE_S) if gate is not None else None
        await refresh_quietly(self.recent, redis)
        self._sample(src)
        admin = self.settings.admin_key
        published_mean, published_n = self.recent.published_rewards()
        groups, n_rewards, total = finished_totals(src)
        return DashboardState(
            time=time.time(), learner=self._learner(src, snap), engine=self._engine(engine),
            servers=servers_out(src, admin.get_secret_value() if admin else None,
                                self.settings.server_id),
            queue=None if snap is None or gate is None else _queue(snap, gate),
            fates=fates_out(src),
            rewards=RewardSummary(sampled_groups=groups,
                               sampled_mean=total / n_rewards if n_rewards else None,
                               sampled_recent_mean=self.history.recent_sampled_mean(),
                               published_recent_mean=published_mean,
                               published_recent_groups=published_n,
                               **trained_rewards(src)),
            rates=self.history.rates(), evals=evals_out(src))

    def _sample(self, src: Sources) -> None:
        _, n_rewards, total = finished_totals(src)
        c, lr = src.counters, src.learner
        self.history.add(Sample(
            t=time.monotonic(), step=as_int(lr.get("step", 0)),
            groups_generated=c.get("groups_created", 0),
            tokens_generated=c.get("tokens_generated", 0),
            groups_trained=as_int(lr.get("groups_trained", 0)),
            tokens_trained=as_int(lr.get("tokens_trained", 0)),
            finished_rewards=n_rewards, finished_sum=total))

    def _learner(self, src: Sources, snap: Snapshot | None) -> LearnerOut:
        params = snap.learner if snap is not None else LearnerParams.from_hash(src.learner)
        if snap is not None:
            age = snap.learner_age_s
        else:
            age = None if params.seen_at is None else max(0.0, time.time() - params.seen_at)
        connected = learner_connected(age)
        lr = src.learner
        return LearnerOut(
            connected=connected, last_seen_s=None if age is None else round(age, 1),
            message=None if connected else no_learner_text(age),
            activity=activity(params, age, snap), version=params.version,
            step=as_int(lr["step"]) if "step" in lr else None,
            updated_at=as_float(lr["updated_at"]) if "updated_at" in lr else None,
            groups_trained=as_int(lr.get("groups_trained", 0)),
            tokens_trained=as_int(lr.get("tokens_trained", 0)),
            max_staleness=params.max_staleness, groups_per_step=params.groups_per_step,
            training=params.training, finished=params.finished,
            pace_steps_per_min=self.history.pace_steps_per_min(), last_stall=stall_out(src))

    def _engine(self, engine: SamplingEngine) -> EngineOut:
        stats = engine.stats()
        extra = {str(k)[:64]: float(v) for k, v in list(stats.extra.items())[:32]
                 if isinstance(v, int | float) and math.isfinite(v)}
        return EngineOut(server_id=self.settings.server_id, engine=engine.name,
                         model=self.settings.model_name, policy_version=engine.policy_version,
                         running=stats.running, waiting=stats.waiting, extra=extra)


def _queue(snap: Snapshot, gate: AdmissionGate) -> QueueOut:
    """The in-flight facts as the admission gate counts them."""
    bound = gate.bound(snap)
    held = snap.budget_counted(bound)
    return QueueOut(open=snap.open, idle=snap.idle, complete=snap.complete,
                    published_unread=snap.undelivered, training=snap.learner.training,
                    being_sampled=snap.remote_pending + gate.local,
                    no_signal_held=held, requests_held=gate.holding,
                    ready_depth=snap.ready_depth,
                    in_flight=snap.others + held + gate.local, bound=bound,
                    admission=gate.enabled)
