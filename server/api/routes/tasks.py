"""``POST /v1/tasks/stats``: the per-task statistics every server keeps in Redis (how each
task's recent groups ended: ``gspo_rl.redisq.tasks``), for environments choosing what
to sample (``gspo_rl.client.selection``). Read-only; a task no group of which has ended (or
whose statistics expired) is ``null``. The work is ``TaskServing``'s
(``gspo_rl.server.rollouts.serving.tasks``).
"""

from __future__ import annotations

from fastapi import APIRouter

from gspo_rl.server.api.deps import TasksDep
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.rollouts.protocol.tasks import TaskStatsList, TaskStatsQuery

router = APIRouter(tags=["tasks"])


@router.post("/v1/tasks/stats", response_model=TaskStatsList,
             responses=error_responses(*V1_POST))
async def task_stats(body: TaskStatsQuery, tasks: TasksDep) -> TaskStatsList:
    """The statistics of each task named (``null``: none yet)."""
    return await tasks.stats(body)
