"""``/v1/evals`` below HTTP: evaluation results appended to the results stream in Redis, and
read back (``gspo_rl.redisq.evals``); the learner logs them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from gspo_rl.contract.schema import Keys
from gspo_rl.redisq.evals import append_eval, list_evals
from gspo_rl.server.rollouts.protocol.evals import EvalIn, EvalList, EvalOut


@dataclass(frozen=True)
class EvalServing:
    """One per app (``app.state.serving_evals``)."""

    redis: Redis
    keys: Keys

    async def post(self, body: EvalIn) -> EvalOut:
        """Appends one result, stamped with the time it arrived, for the learner to log."""
        record: dict[str, Any] = {**body.model_dump(exclude_none=True), "time": time.time()}
        entry_id = await append_eval(self.redis, self.keys, record)
        return EvalOut(id=entry_id, **record)

    async def latest(self, after: str | None, limit: int) -> EvalList:
        """The latest ``limit`` results, or the first ``limit`` after the id ``after``."""
        out = []
        for entry_id, record in await list_evals(self.redis, self.keys, after, limit):
            try:
                out.append(EvalOut(id=entry_id, **record))
            except (TypeError, ValueError):
                continue  # not a result this server wrote
        return EvalList(evals=out)
