"""``/v1/evals``: evaluation results, posted by environments, logged by the learner.

``POST /v1/evals`` appends one result (an eval set's name, the policy version it evaluated,
its metrics) to the results stream in Redis (``gspo_rl.redisq.evals``); the learner
writes it to its metrics stream beside the step metrics. ``GET /v1/evals`` lists the latest
(or those after ``?after=<id>``). The evaluation itself runs where the environment runs
(``gspo_rl.client.evals``), with unrecorded requests (``"record": false``); the server only
carries its results to the learner, so they reach every metrics backend. The work is
``EvalServing``'s (``gspo_rl.server.rollouts.serving.evals``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gspo_rl.server.api.deps import EvalsDep
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.rollouts.protocol.evals import EvalIn, EvalList, EvalOut

router = APIRouter(tags=["evals"])


@router.post("/v1/evals", response_model=EvalOut, responses=error_responses(*V1_POST))
async def post_eval(body: EvalIn, evals: EvalsDep) -> EvalOut:
    """Stores one evaluation result for the learner to log."""
    return await evals.post(body)


@router.get("/v1/evals", response_model=EvalList, responses=error_responses(401, 422, 503))
async def get_evals(evals: EvalsDep,
                    after: Annotated[str | None, Query(pattern=r"^\d+-\d+$")] = None,
                    limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> EvalList:
    """The latest ``limit`` results, or the first ``limit`` after the id ``after``."""
    return await evals.latest(after, limit)
