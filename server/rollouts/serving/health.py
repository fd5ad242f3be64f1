"""``GET /health`` below HTTP: is this server ready to sample and record, and with which
weights.

``HealthServing.check`` probes Redis with a write (a small key with a TTL, bounded by
``REDIS_PING_TIMEOUT_S``), not only a ping: a Redis at ``maxmemory`` answers pings but refuses
every write, and the server then refuses every rollout and reward. The status is ``"dead"``
once the engine has died (``SamplingEngine.dead_reason``), else ``"ok"`` or, with Redis
unreachable or refusing writes, ``"degraded"``; only ``"ok"`` is healthy. The learner is
described as the admission gate last read the queue.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import redis.exceptions
from redis.asyncio import Redis

from gspo_rl.contract.admission import learner_connected, no_learner_text
from gspo_rl.contract.schema import Keys
from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.sampler import SamplingEngine
from gspo_rl.server.rollouts.admission import AdmissionGate
from gspo_rl.server.rollouts.protocol.health import HealthResponse, LearnerHealth, RedisState

REDIS_PING_TIMEOUT_S = 1.0
PROBE_TTL_MS = 60_000


@dataclass(frozen=True)
class HealthServing:
    """One per app (``app.state.serving_health``); ``gate`` None: no admission."""

    settings: ServerSettings
    engine: SamplingEngine
    redis: Redis
    keys: Keys
    gate: AdmissionGate | None = None

    async def check(self) -> HealthResponse:
        """The server's health now (the module docstring says what each status means)."""
        redis_state = await self._probe_redis()
        redis_ok = redis_state == "ok"
        dead = self.engine.dead_reason()
        stats = self.engine.stats()
        settings, engine = self.settings, self.engine
        return HealthResponse(
            status="dead" if dead else "ok" if redis_ok else "degraded", engine=engine.name,
            model=settings.model_name, model_path=engine.model_path,
            policy_version=engine.policy_version, server_id=settings.server_id,
            redis=redis_state, running=stats.running,
            waiting=stats.waiting, engine_error=dead, warnings=settings.security_warnings,
            learner=await self._learner() if redis_ok else None,
        )

    async def _learner(self) -> LearnerHealth | None:
        """From the admission gate's latest read of the queue (at most 50 ms old)."""
        if self.gate is None:
            return None
        try:
            snap = await self.gate.snapshot()
        except (redis.exceptions.RedisError, OSError):
            return None
        age = snap.learner_age_s
        connected = learner_connected(age)
        return LearnerHealth(connected=connected,
                             last_seen_s=None if age is None else round(age, 1),
                             version=snap.learner.version, finished=snap.learner.finished,
                             message=None if connected else no_learner_text(age))

    async def _probe_redis(self) -> RedisState:
        """"ok", "out_of_memory" (writes refused) or "unreachable"."""
        key = f"{self.keys.prefix}:server:{self.settings.server_id}:health"
        try:
            await asyncio.wait_for(self.redis.set(key, b"1", px=PROBE_TTL_MS),
                                   REDIS_PING_TIMEOUT_S)
        except redis.exceptions.OutOfMemoryError:
            return "out_of_memory"
        except (TimeoutError, redis.exceptions.RedisError, OSError):
            return "unreachable"
        return "ok"
