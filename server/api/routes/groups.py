"""``/v1/groups``: open a group of multi-turn episodes; a group's state, its rollouts and
which of them have rewards; give a group up.

``POST /v1/groups {"size": G, "metadata": {...}}`` opens G empty episodes of one task and
returns their ``rollout_id``s; each episode is then driven with chat completions carrying its
``rollout_id`` (``gspo_rl.server.rollouts.episodes``) and ends with its reward (``POST
/v1/rewards``). ``POST /v1/groups/{id}/abandon`` ends an open group now (any group: sampled
or of episodes): an environment that will post no more rewards for it releases the admission
capacity it holds at once instead of at its deadline.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict

from gspo_rl.server.api.deps import (
    MetricsDep,
    OptionalTokenizerDep,
    SettingsDep,
    StoreDep,
    admit_new_group,
)
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.api.errors import APIError
from gspo_rl.server.rollouts.episodes import open_episode_group
from gspo_rl.server.rollouts.fields import int_in
from gspo_rl.server.rollouts.limits import Metadata, check_group_size
from gspo_rl.server.rollouts.trajectory import TrajectoryOut, load_trajectories


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


router = APIRouter(tags=["groups"])


@router.post("/v1/groups", response_model=OpenGroupOut,
             dependencies=[Depends(admit_new_group)],
             responses=error_responses(*V1_POST, 501))
async def open_group(body: OpenGroupIn, store: StoreDep, settings: SettingsDep,
                     metrics: MetricsDep) -> OpenGroupOut:
    """Opens ``size`` empty multi-turn episodes as one group (recorded in Redis before the
    response, so every returned ``rollout_id`` can take turns and rewards at once)."""
    check_group_size(body.size, settings.queue.max_group_size)
    group_id, rollout_ids = await open_episode_group(store, body.size, body.metadata,
                                                     settings.server_id)
    metrics.groups.inc()
    metrics.rollouts.inc(len(rollout_ids))
    return OpenGroupOut(group_id=group_id, rollout_ids=rollout_ids)


@router.post("/v1/groups/{group_id}/abandon", response_model=AbandonOut,
             responses=error_responses(*V1_POST, 404))
async def abandon_group(group_id: Annotated[str, Path(min_length=1, max_length=256)],
                        store: StoreDep) -> AbandonOut:
    """Gives a group up: it stops counting as in flight at once and ends as at its deadline
    (published with its rewards when it has enough of them, else dropped). Idempotent. 404
    for an unknown group, or one whose records have expired."""
    state = await store.abandon_group(group_id)
    if state is None:
        raise APIError(404, f"unknown group {group_id!r} (never created, or expired)",
                       code="unknown_group")
    return AbandonOut(group_id=group_id, state=state)


# exclude_unset: ``trajectory`` appears only with ?include=tokens (every other field is set).
@router.get("/v1/groups/{group_id}", response_model=GroupOut, response_model_exclude_unset=True,
            responses=error_responses(401, 404, 422, 501, 503))
async def get_group(
    group_id: Annotated[str, Path(min_length=1, max_length=256)], store: StoreDep,
    tokenizer: OptionalTokenizerDep,
    include: Annotated[Literal["tokens"] | None, Query(
        description="'tokens': each rollout's trajectory (token ids, loss mask, log-probs, "
                    "versions, turns with decoded text, advantage once published)")] = None,
) -> GroupOut:
    """A group's state. 404 for an unknown group, or one whose records have expired."""
    g = await store.get_group(group_id)
    if g is None:
        raise APIError(404, f"unknown group {group_id!r} (never created, or expired)",
                       code="unknown_group")
    trajectories = {}
    if include == "tokens":  # the tokenizer only then: a queue-only app has none
        if tokenizer is None:
            raise APIError(501, "this server has no tokenizer to decode trajectories",
                           code="tokens_unsupported")
        trajectories = await load_trajectories(store, tokenizer, group_id, g.rollout_ids,
                                                 g.stream_id)
    rollouts = []
    for rid in g.rollout_ids:
        rw = g.rewards.get(rid)
        extra = {"trajectory": trajectories.get(rid)} if include == "tokens" else {}
        rollouts.append(GroupRolloutOut(
            rollout_id=rid, rewarded=rw is not None,
            reward=None if rw is None else rw["reward"],
            turn_rewards=None if rw is None else rw["turn_rewards"], **extra))
    return GroupOut(
        group_id=g.group_id, state=g.state, size=g.size,
        n_rollouts=len(g.rollout_ids), n_rewarded=g.n_rewarded, created_at=g.created_at,
        deadline=g.deadline, partial=g.partial, stream_id=g.stream_id,
        drop_reason=g.drop_reason, metadata=g.metadata, rollouts=rollouts)
