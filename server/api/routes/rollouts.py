"""``POST /v1/rollouts``: the native group call, ``n`` samples of one prompt.

The environment gets back the group id and, per rollout, its id, tokens, behavior
log-probabilities and policy versions; it then posts one reward per rollout
(``POST /v1/rewards``). The prompt is exactly one of raw text, chat messages (templated with
``tools``) or token ids.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from gspo_rl.server.api.deps import SamplingDep, admit_new_group
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.rollouts.protocol import RolloutRequest, RolloutResponse
from gspo_rl.server.rollouts.serving.rollouts import rollout_prompt, rollout_response

router = APIRouter(tags=["rollouts"])
ROUTE = "rollouts"


@router.post("/v1/rollouts", response_model=RolloutResponse,
             dependencies=[Depends(admit_new_group)],
             responses=error_responses(*V1_POST, 404))
async def rollouts(body: RolloutRequest, svc: SamplingDep) -> RolloutResponse:
    """Samples a group of ``n`` rollouts of one prompt and records it in Redis."""
    svc.check_model(body.model)
    prompt_ids = await rollout_prompt(body, svc.tokenizer, svc.settings)
    result = await svc.sample(body, prompt_ids, max_tokens=body.max_tokens,
                              top_logprobs=body.top_logprobs, route=ROUTE)
    return rollout_response(result, body, svc)
