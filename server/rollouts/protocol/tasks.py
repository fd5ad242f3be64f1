"""``POST /v1/tasks/stats``: task ids in (strict, at most ``MAX_IDS``), each task's statistics
out (``null``: none yet; ``gspo_rl.redisq.tasks``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gspo_rl.redisq.tasks import MAX_TASK_ID

MAX_IDS = 1000
TaskId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TASK_ID)]


class TaskStatsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    ids: list[TaskId] = Field(min_length=1, max_length=MAX_IDS)
    """Task ids, as the groups' metadata names them (``task_id``)."""


class TaskStats(BaseModel):
    groups: int
    """Groups of the task that ended (published, or dropped for equal rewards)."""
    no_signal: int
    """Those whose rewards were all equal (no learning signal)."""
    streak: int
    """Its latest groups in a row with all rewards equal (0: the last one had a signal)."""
    streak_value: float
    """Their reward (every sample's)."""
    reward_ema: float
    """Moving average of its groups' mean reward (the last group weighs 0.3)."""
    last_mean: float
    updated_at: float


class TaskStatsList(BaseModel):
    stats: dict[str, TaskStats | None]
