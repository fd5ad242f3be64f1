"""``/v1/groups``: a group's state, its rollouts and which of them have rewards.

(Opening a group of multi-turn episodes, ``POST /v1/groups``, belongs here too.)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel

from server.errors import APIError
from server.routes.rewards import StoreDep


class GroupRolloutOut(BaseModel):
    rollout_id: str
    rewarded: bool
    reward: float | None = None
    turn_rewards: list[float] | None = None


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


router = APIRouter(tags=["groups"])


@router.get("/v1/groups/{group_id}", response_model=GroupOut)
async def get_group(
    group_id: Annotated[str, Path(min_length=1, max_length=256)], store: StoreDep
) -> GroupOut:
    """A group's state. 404 for an unknown group, or one whose records have expired."""
    g = await store.get_group(group_id)
    if g is None:
        raise APIError(404, f"unknown group {group_id!r} (never created, or expired)",
                       code="unknown_group")
    rollouts = []
    for rid in g.rollout_ids:
        rw = g.rewards.get(rid)
        rollouts.append(GroupRolloutOut(
            rollout_id=rid, rewarded=rw is not None,
            reward=None if rw is None else rw["reward"],
            turn_rewards=None if rw is None else rw["turn_rewards"]))
    return GroupOut(
        group_id=g.group_id, state=g.state, size=g.size,  # type: ignore[arg-type]
        n_rollouts=len(g.rollout_ids), n_rewarded=g.n_rewarded, created_at=g.created_at,
        deadline=g.deadline, partial=g.partial, stream_id=g.stream_id,
        drop_reason=g.drop_reason, metadata=g.metadata, rollouts=rollouts)
