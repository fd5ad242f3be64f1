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
stream) before the response; ``group_complete`` says which items did that. The work is
``RewardServing``'s (``gspo_rl.server.rollouts.serving.rewards``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Response

from gspo_rl.server.api.deps import RewardsDep
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.rollouts.protocol.rewards import Rewards, RewardsOut

RewardsBody = Annotated[Rewards, Body()]
router = APIRouter(tags=["rewards"])


@router.post("/v1/rewards", response_model=RewardsOut,
             responses=error_responses(*V1_POST, 404, 409, 410))
async def post_rewards(body: RewardsBody, rewards: RewardsDep) -> Response:
    """Stores rewards, all of them or none (see the module docstring)."""
    out = await rewards.post(body if isinstance(body, list) else [body])
    # Serialised here: FastAPI would validate the model it was just given again (response_model
    # still documents the body), a third of this route's own CPU.
    return Response(out.model_dump_json(), media_type="application/json")
