"""``/v1/evals``: evaluation results, posted by environments, logged by the learner.

``POST /v1/evals`` appends one result (an eval set's name, the policy version it evaluated,
its metrics) to the results stream in Redis (``gspo_rl.contract.queue.evals``); the learner
writes it to its metrics stream beside the step metrics. ``GET /v1/evals`` lists the latest
(or those after ``?after=<id>``). The evaluation itself runs where the environment runs
(``gspo_rl.client.evals``), with unrecorded requests (``"record": false``); the server only
carries its results to the learner, so they reach every metrics backend.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gspo_rl.contract.queue.evals import append_eval, list_evals
from gspo_rl.server.api.deps import KeysDep, RedisDep
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.rollouts.fields import int_in
from gspo_rl.server.rollouts.limits import Metadata

router = APIRouter(tags=["evals"])
MAX_METRICS = 256
NAME_PATTERN = r"^[A-Za-z0-9_.\-/@]{1,64}$"


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    if len(metrics) > MAX_METRICS:
        raise ValueError(f"at most {MAX_METRICS} metrics, got {len(metrics)}")
    for name, value in metrics.items():
        if not 1 <= len(name) <= 64:
            raise ValueError(f"metric names are 1 to 64 characters, got {name[:80]!r}")
        if not math.isfinite(value):
            raise ValueError(f"metric {name!r} is not a finite number")
    return metrics


class EvalIn(BaseModel):
    """One evaluation of one eval set at one policy version."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=NAME_PATTERN)
    """The eval set (letters, digits and ``_.-/@``; the learner logs ``eval/<name>/<metric>``)."""
    policy_version: int_in(ge=0)  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    """The version of the weights that sampled every answer (the environment checks)."""
    metrics: Annotated[dict[str, float], AfterValidator(_finite)] = Field(
        min_length=1, max_length=MAX_METRICS,
        json_schema_extra={"propertyNames": {"minLength": 1, "maxLength": 64}})
    """Flat numbers: ``mean_reward``, ``pass@1``, ``pass@4``, ``tasks``, ..."""
    metadata: Metadata | None = None
    """Anything else worth keeping with it (sampling settings, the data file)."""


class EvalOut(EvalIn):
    id: str
    """The result's id in the results stream (ordered by time)."""
    time: float
    """When the server received it (Unix seconds)."""


class EvalList(BaseModel):
    evals: list[EvalOut]


@router.post("/v1/evals", response_model=EvalOut, responses=error_responses(*V1_POST))
async def post_eval(body: EvalIn, redis: RedisDep, keys: KeysDep) -> EvalOut:
    """Stores one evaluation result for the learner to log."""
    record: dict[str, Any] = {**body.model_dump(exclude_none=True), "time": time.time()}
    entry_id = await append_eval(redis, keys, record)
    return EvalOut(id=entry_id, **record)


@router.get("/v1/evals", response_model=EvalList, responses=error_responses(401, 422, 503))
async def get_evals(redis: RedisDep, keys: KeysDep,
                    after: Annotated[str | None, Query(pattern=r"^\d+-\d+$")] = None,
                    limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> EvalList:
    """The latest ``limit`` results, or the first ``limit`` after the id ``after``."""
    out = []
    for entry_id, record in await list_evals(redis, keys, after, limit):
        try:
            out.append(EvalOut(id=entry_id, **record))
        except (TypeError, ValueError):
            continue  # not a result this server wrote
    return EvalList(evals=out)
