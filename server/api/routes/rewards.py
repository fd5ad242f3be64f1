"""``POST /v1/rewards``: environments score rollouts.

The body is one reward ``{"rollout_id", "reward", "turn_rewards"?}`` or a list of them.

Semantics of a call (one item or many), which clients can rely on:

1. The body is validated first (finite numbers, known fields, sizes). Any invalid item: 422
   (400 malformed JSON, 413 body too large) and nothing is stored.
2. All items are then checked and written by one Redis script, atomically: **either every
   item is stored, or none is.** A 200 means every rollout in the call now has the reward
   it names (``stored``, or ``duplicate``: it already had exactly that reward; repeating a
   call is safe). If any item fails, the call fails with the status of the first failing
   item in list order (404 unknown rollout, 409 a different reward already stored, 410 the
   group expired or was finalised without this rollout) and ``error.details.results`` gives
   every item's status (the valid ones are ``not_applied``): fix or remove the failing
   items and post again.
3. A 503 means Redis was unreachable: nothing is known to be stored; retrying is safe.

A reward that completes its group triggers the group's publication (advantages, ready
stream) before the response; ``group_complete`` says which items did that.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Response
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from gspo_rl.contract.queue.groups.store import RewardItem
from gspo_rl.server.api.deps import StoreDep
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.api.errors import APIError, reward_item_status

MAX_REWARDS_PER_CALL = 1024
MAX_TURNS = 4096
MAX_ABS_REWARD = 1e9  # far beyond any real reward; keeps the group's std finite in float32

FiniteFloat = Annotated[
    float, Field(strict=True, allow_inf_nan=False, ge=-MAX_ABS_REWARD, le=MAX_ABS_REWARD)
]


class RewardIn(BaseModel):
    """A reward for one rollout."""

    model_config = ConfigDict(extra="forbid", strict=True)

    rollout_id: str = Field(min_length=1, max_length=256)
    """The id the server returned with the rollout."""
    reward: FiniteFloat
    """The rollout's scalar reward (a finite JSON number)."""
    turn_rewards: list[FiniteFloat] | None = Field(default=None, max_length=MAX_TURNS)
    """Optional per-turn rewards of a multi-turn episode, stored and passed to the learner."""


def _body_kind(v: Any) -> str:
    return "many" if isinstance(v, list) else "one"


RewardsBody = Annotated[
    Annotated[RewardIn, Tag("one")]
    | Annotated[list[RewardIn], Tag("many"), Field(min_length=1, max_length=MAX_REWARDS_PER_CALL)],
    Discriminator(_body_kind),
    Body(),
]


class RewardItemOut(BaseModel):
    rollout_id: str
    status: Literal["stored", "duplicate", "unknown_rollout", "conflict", "expired", "closed",
                    "not_applied"]
    """stored | duplicate (same reward already stored: no change) | unknown_rollout (404) |
    conflict (another reward stored, 409) | expired / closed (group gone or finalised, 410) |
    not_applied (valid, but another item failed, so nothing of the call was stored)."""
    group_id: str | None = None
    group_complete: bool = False
    """This reward was the group's last: the group has been published (or dropped)."""


class RewardsOut(BaseModel):
    results: list[RewardItemOut]
    stored: int
    duplicates: int


_MESSAGES = {
    "unknown_rollout": "unknown rollout (never recorded, or its records expired)",
    "conflict": "a different reward is already stored for this rollout",
    "expired": "the rollout's group expired before all its rewards arrived",
    "closed": "the rollout's group was finalised without this rollout",
}

router = APIRouter(tags=["rewards"])


@router.post("/v1/rewards", response_model=RewardsOut,
             responses=error_responses(*V1_POST, 404, 409, 410))
async def post_rewards(body: RewardsBody, store: StoreDep) -> Response:
    """Stores rewards, all of them or none (see the module docstring)."""
    items_in = body if isinstance(body, list) else [body]
    outcome = await store.post_rewards(
        [RewardItem(i.rollout_id, i.reward, i.turn_rewards) for i in items_in])
    results = [RewardItemOut(rollout_id=r.rollout_id, status=r.status,
                             group_id=r.group_id, group_complete=r.group_complete)
               for r in outcome.results]
    if not outcome.applied:
        failed = [r for r in results if r.status != "not_applied"]
        first = failed[0]
        where = f"item {results.index(first)} " if len(results) > 1 else ""
        why = _MESSAGES.get(first.status, first.status)
        message = f"{where}rollout {first.rollout_id!r}: {why}"
        if len(failed) > 1:
            message += f" (and {len(failed) - 1} more failing item(s))"
        if len(results) > 1:
            message += "; nothing in this call was stored"
        raise APIError(reward_item_status(first.status), message, code=first.status,
                       details={"results": [r.model_dump() for r in results]})
    out = RewardsOut(
        results=results,
        stored=sum(r.status == "stored" for r in results),
        duplicates=sum(r.status == "duplicate" for r in results),
    )
    # Serialised here: FastAPI would validate the model it was just given again (response_model
    # still documents the body), a third of this route's own CPU.
    return Response(out.model_dump_json(), media_type="application/json")
