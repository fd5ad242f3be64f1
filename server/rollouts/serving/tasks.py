"""``/v1/tasks/stats`` below HTTP: the per-task statistics every server keeps in Redis
(``gspo_rl.redisq.tasks``); the counts are served as integers."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from gspo_rl.contract.schema import Keys
from gspo_rl.redisq.tasks import read_task_stats
from gspo_rl.server.rollouts.protocol.tasks import TaskStats, TaskStatsList, TaskStatsQuery

_COUNTS = ("groups", "no_signal", "streak")  # stored as floats, served as ints


@dataclass(frozen=True)
class TaskServing:
    """One per app (``app.state.serving_tasks``)."""

    redis: Redis
    keys: Keys

    async def stats(self, body: TaskStatsQuery) -> TaskStatsList:
        """The statistics of each task named (None: none yet), each id once."""
        raw = await read_task_stats(self.redis, self.keys, list(dict.fromkeys(body.ids)))
        return TaskStatsList(stats={
            tid: TaskStats(**{k: int(v) if k in _COUNTS else v for k, v in st.items()})
            if st else None for tid, st in raw.items()})
