"""``/v1/evals``: one evaluation result in (an eval set's name, the policy version it
evaluated, flat finite metrics), the stored results out. Bodies in are strict and refuse
unknown fields."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gspo_rl.server.rollouts.fields import int_in
from gspo_rl.server.rollouts.limits import Metadata

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
