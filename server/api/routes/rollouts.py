"""``POST /v1/rollouts``: the native group call, ``n`` samples of one prompt.

The environment gets back the group id and, per rollout, its id, tokens, behavior
log-probabilities and policy versions; it then posts one reward per rollout
(``POST /v1/rewards``). The prompt is exactly one of raw text, chat messages (templated with
``tools``) or token ids. The work is ``RolloutServing``'s
(``gspo_rl.server.rollouts.serving.rollouts``).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from gspo_rl.server.api.deps import RolloutsDep, admit_new_group
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.rollouts.protocol.rollouts import RolloutRequest, RolloutResponse

router = APIRouter(tags=["rollouts"])


@router.post("/v1/rollouts", response_model=RolloutResponse,
             dependencies=[Depends(admit_new_group)],
             responses=error_responses(*V1_POST, 404))
async def rollouts(body: RolloutRequest, serving: RolloutsDep) -> RolloutResponse:
    """Samples a group of ``n`` rollouts of one prompt and records it in Redis."""
    return await serving.create(body)
