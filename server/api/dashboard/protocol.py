"""The dashboard's wire models: ``GET /v1/dashboard/state`` (``DashboardState``) and the
rollout browser's ``GET /v1/dashboard/groups`` (``GroupList``) and
``GET /v1/dashboard/groups/{group_id}`` (``GroupDetail``).

Every number says where it comes from (docs/dashboard.md): the learner's state hash
(``Keys.learner_state``), the queue's counters (``Keys.counters``), the finished-rewards totals
(``Keys.finished_rewards``), the in-flight facts (``gspo_rl.redisq.inflight``), the
registry (``gspo_rl.redisq.registry``), the evaluation stream, the ready stream and the
group records. Rates are measured by this server between the dashboard's reads (``Rates``);
None where nothing was measured yet. Sampled rewards (what the environment scored), the
rewards of published groups (what the learner reads) and of trained ones (what its steps
trained, from its state hash) are separate fields, never one number.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class StallOut(BaseModel):
    reason: str
    """``no_groups``, ``all_stale``, ``redis_down``, ``no_servers``, ``servers_behind`` or
    ``weight_push`` (``gspo_rl.learner.runtime.progress``)."""
    detail: str
    at: float
    """When the learner last reported it (Unix time, the learner's clock)."""
    for_s: float
    """How long it had lasted then."""
    ended_at: float | None = None
    """When it ended (None: it had not ended at the learner's last report)."""


class LearnerOut(BaseModel):
    connected: bool
    """Its heartbeat (``seen_at``) is at most 30 s old (``learner_connected``)."""
    last_seen_s: float | None
    message: str | None = None
    """What to do when none is connected."""
    activity: str
    """What it does now, from the queue: training a step, waiting for groups (and why),
    finished, not connected."""
    version: int
    step: int | None = None
    updated_at: float | None = None
    """When it last published its state (Unix time, the learner's clock)."""
    groups_trained: int = 0
    tokens_trained: int = 0
    max_staleness: int | None = None
    groups_per_step: int | None = None
    training: int = 0
    finished: str = ""
    pace_steps_per_min: float | None = None
    """Steps per minute over the last few minutes this server watched (None: too soon)."""
    last_stall: StallOut | None = None
    """The last stall it published (None: none, or a learner that does not publish them)."""


class LoadOut(BaseModel):
    running: int
    """Requests being decoded."""
    waiting: int
    """Requests queued."""


class WeightSyncOut(BaseModel):
    version: int
    """The version the update loads (or loaded, or failed to load)."""
    state: Literal["receiving", "loaded", "failed"]
    started_at: float
    """When it started (Unix time, that server's clock)."""
    duration_s: float | None = None
    """How long it took (None while receiving)."""
    error: str | None = None
    """Why it failed."""


class ServerOut(BaseModel):
    server_id: str
    url: str
    engine: str
    model: str
    policy_version: int
    heartbeat_age_s: float | None
    """Seconds since its last registry heartbeat (from the heartbeat key's time to live)."""
    verified: bool
    """Its registration verifies with this server's admin key (or neither has one)."""
    load: LoadOut | None = None
    """Its engine's load at its last heartbeat (None: a server that does not report it)."""
    weight_sync: WeightSyncOut | None = None
    """Its current or last weight update, as of its last heartbeat (None: none since it
    started, or a server that does not report it)."""
    problem: str | None = None
    this: bool = False


class EngineOut(BaseModel):
    server_id: str
    engine: str
    model: str
    policy_version: int
    running: int
    waiting: int
    extra: dict[str, float]
    """Engine-specific load figures (``Engine.stats().extra``)."""


class QueueOut(BaseModel):
    open: int
    """Open groups with recent activity (waiting for rewards): in flight."""
    idle: int
    """Open groups without recent activity: not counted in flight."""
    complete: int
    published_unread: int
    """Published groups the learner has not read (its lag on the ready stream)."""
    training: int
    being_sampled: int
    """Requests being sampled: other servers' published counts plus this server's own."""
    no_signal_held: int
    """Groups dropped for equal rewards that still hold a place (``no_signal_hold_s``)."""
    requests_held: int = 0
    """New groups' requests this server holds at the bound now, each for at most
    ``admission_wait_s`` (the ``gspo_admission_held`` gauge)."""
    ready_depth: int
    in_flight: int
    bound: int | None
    """The admission bound for this server (None: none)."""
    admission: bool


class FatesOut(BaseModel):
    generated: int
    published: int
    trained: int
    dropped: dict[str, int]
    """By reason, from the counters (``groups_dropped_<reason>``, ``groups_<why>_dropped``)."""
    in_flight: int
    tokens_generated: int
    tokens_trained: int
    trained_group_fraction: float | None
    trained_token_fraction: float | None


class RewardSummary(BaseModel):
    sampled_groups: int
    """Groups that finished with rewards (published, or dropped for equal rewards)."""
    sampled_mean: float | None
    """Mean reward per sample over all of them (``Keys.finished_rewards``)."""
    sampled_recent_mean: float | None
    """The same over the groups that finished while this server watched (last minutes)."""
    published_recent_mean: float | None
    """Mean reward of the recently published groups (ready-stream heads: what the learner
    reads; groups with equal rewards are never published)."""
    published_recent_groups: int
    trained_last_mean: float | None = None
    """Mean reward per sample of the groups the learner's last step trained (its state hash's
    ``reward_trained``; None: no step yet, or a learner that does not publish it)."""
    trained_recent_mean: float | None = None
    """The same over its last ``trained_recent_steps`` steps (``reward_trained_recent``)."""
    trained_recent_steps: int = 0


class Rates(BaseModel):
    window_s: float
    tokens_generated_per_s: float | None = None
    tokens_trained_per_s: float | None = None
    groups_generated_per_min: float | None = None
    groups_trained_per_min: float | None = None


class DashboardEval(BaseModel):
    name: str
    policy_version: int
    time: float
    metrics: dict[str, float]


class DashboardState(BaseModel):
    time: float
    """This server's clock (Unix time)."""
    learner: LearnerOut
    engine: EngineOut
    servers: list[ServerOut]
    queue: QueueOut | None
    """None: this server has no admission gate to read the in-flight facts with."""
    fates: FatesOut
    rewards: RewardSummary
    rates: Rates
    evals: list[DashboardEval]


Where = Literal["unread", "delivered", "acknowledged", "no_signal"]


class GroupSummary(BaseModel):
    group_id: str
    where: Where
    """unread (published, the learner has not read it) | delivered (read, its step not yet
    acknowledged) | acknowledged (trimmed from the stream: trained, or dropped stale) |
    no_signal (dropped: every reward equal, never published)."""
    time: float
    """When it was published, or dropped (Unix time)."""
    stream_id: str | None = None
    size: int
    rewards: list[float]
    advantages: list[float] | None = None
    min_version: int | None = None
    """The oldest policy version of any token the model sampled in the group."""
    labels: dict[str, str]
    """A few metadata values (task id, source, environment, difficulty)."""


class GroupList(BaseModel):
    groups: list[GroupSummary]


class SegmentOut(BaseModel):
    kind: Literal["context", "model"]
    """context: prompt, tool results, template tokens (loss mask 0); model: one model turn."""
    turn: int | None = None
    text: str | None = None
    """A context segment's decoded text (the middle cut when long)."""
    tokens: list[str] | None = None
    """A model turn's tokens, each decoded alone."""
    logprobs: list[float] | None = None
    versions: list[int] | None = None
    log_ratios: list[float | None] | None = None
    """Each token's log importance ratio, log(pi_prox / pi_behavior): the learner's
    probability at the weights its step started from against the sampler's, as the learner
    wrote it after training the rollout (``Keys.token_ratios``). None: none in Redis (not
    trained yet, dropped, expired, or a learner that records none); null entries: tokens it
    did not train."""
    advantage: float | None = None
    """What this turn trains with (published groups only)."""
    reward: float | None = None
    """Its turn reward, when the episode posted turn rewards."""
    truncated: int = 0
    """Tokens of this segment not shown (over the request's cap)."""


class RolloutView(BaseModel):
    rollout_id: str
    reward: float | None
    advantage: float | None = None
    finish_reason: str
    n_tokens: int
    n_model_tokens: int
    segments: list[SegmentOut]


class GroupDetail(BaseModel):
    group_id: str
    state: str
    """The group's state in Redis: open, complete, published, dropped, expired."""
    drop_reason: str | None = None
    stream_id: str | None = None
    advantages_from: Literal["ready_stream", "none"]
    """ready_stream: the published entry's head, what the learner trains with; none: not
    published (or its entry is no longer known)."""
    labels: dict[str, str]
    rollouts: list[RolloutView]
    """Those whose records are still in Redis, at most the request's ``rollouts``."""
    missing: int = 0
    """Rollouts whose records have expired."""
