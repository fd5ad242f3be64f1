"""``POST /v1/tasks/stats``: the per-task statistics every server keeps in Redis (how each
task's recent groups ended: ``gspo_rl.contract.queue.tasks``), for environments choosing what
to sample (``gspo_rl.client.selection``). Read-only; a task no group of which has ended (or
whose statistics expired) is ``null``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gspo_rl.contract.queue.tasks import MAX_TASK_ID, read_task_stats
from gspo_rl.server.api.deps import KeysDep, RedisDep
from gspo_rl.server.api.error_docs import V1_POST, error_responses

router = APIRouter(tags=["tasks"])
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


@router.post("/v1/tasks/stats", response_model=TaskStatsList,
             responses=error_responses(*V1_POST))
async def task_stats(body: TaskStatsQuery, redis: RedisDep, keys: KeysDep) -> TaskStatsList:
    """The statistics of each task named (``null``: none yet)."""
    raw = await read_task_stats(redis, keys, list(dict.fromkeys(body.ids)))
    return TaskStatsList(stats={tid: TaskStats(**{k: int(v) if k in ("groups", "no_signal",
                                                                      "streak") else v
                                                  for k, v in st.items()}) if st else None
                                for tid, st in raw.items()})
