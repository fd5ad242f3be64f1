"""``/v1/groups``: opening a group of multi-turn episodes, a group's state and its rollouts,
giving a group up. Bodies in are strict and refuse unknown fields."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gspo_rl.server.rollouts.fields import int_in
from gspo_rl.server.rollouts.limits import Metadata
from gspo_rl.server.rollouts.trajectory import TrajectoryOut


class OpenGroupIn(BaseModel):
    """A group of ``size`` multi-turn episodes of one task."""

    model_config = ConfigDict(extra="forbid", strict=True)

    size: int_in(ge=1)  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    """Episodes in the group (G); at most the queue's ``max_group_size``."""
    metadata: Metadata | None = None
    """Stored with the group and handed to the learner (task id, answer key, ...)."""


class OpenGroupOut(BaseModel):
    group_id: str
    rollout_ids: list[str]
    """One per episode: pass it with every chat completion of that episode
    (``extra_body={"rollout_id": ...}``) and with its reward."""
    policy_version: int | None = None
    """The policy version this server held when it opened the group: its episodes sample at
    it or at a later one (null: a server without an engine)."""


class GroupRolloutOut(BaseModel):
    rollout_id: str
    rewarded: bool
    reward: float | None = None
    turn_rewards: list[float] | None = None
    trajectory: TrajectoryOut | None = None
    """Only with ``?include=tokens``: the stored tokens, mask, log-probs, versions and turns
    (``gspo_rl.server.rollouts.trajectory``); null when the record has expired."""


class GroupOut(BaseModel):
    group_id: str
    state: Literal["open", "complete", "published", "dropped", "expired"]
    """open (waiting for rewards) | complete (all rewarded, being published) | published (on
    the ready stream) | dropped (e.g. zero reward variance: see drop_reason) | expired."""
    size: int
    n_rollouts: int
    n_rewarded: int
    created_at: float
    deadline: float
    """Unix time after which an incomplete group expires."""
    partial: bool
    """Finalised at its deadline with only the rewarded rollouts."""
    stream_id: str | None = None
    drop_reason: str | None = None
    metadata: dict[str, Any]
    rollouts: list[GroupRolloutOut]


class AbandonOut(BaseModel):
    group_id: str
    state: Literal["published", "expired", "dropped", "complete"]
    """After the call: published (it had ``min_rewarded_to_finalise`` rewards: published with
    them, partial) | expired (fewer: dropped, drop_reason "abandoned") | an ended group's
    state as it was (abandoning again changes nothing) | complete (being published)."""
