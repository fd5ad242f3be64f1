"""``GET /health``: is this server ready to sample and record, and with which weights.

Open (no key): load balancers and the tests' start-up wait poll it. It checks Redis with a short
timeout because a server that cannot record rollouts is not serving its purpose: 503 then. The
check is a write (a small key with a TTL), not only a ping: a Redis at ``maxmemory`` answers
pings but refuses every write, and the server then refuses every rollout and reward. A dead
engine (``Engine.dead_reason``) is 503 ``"status": "dead"`` too (``gspo_rl.server.run``).
"""

from __future__ import annotations

import asyncio
from typing import Literal

import redis.exceptions
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from redis.asyncio import Redis

from gspo_rl.contract.admission import learner_connected, no_learner_text
from gspo_rl.contract.queue.schema import Keys
from gspo_rl.server.api.deps import EngineDep, KeysDep, RedisDep, SettingsDep

router = APIRouter(tags=["health"])
REDIS_PING_TIMEOUT_S = 1.0
RedisState = Literal["ok", "unreachable", "out_of_memory"]
PROBE_TTL_MS = 60_000


class LearnerHealth(BaseModel):
    connected: bool
    """Its heartbeat is at most 30 s old (``gspo_rl.contract.admission.learner_connected``)."""
    last_seen_s: float | None
    """Seconds since it last read the queue (None: no learner ever did)."""
    version: int
    finished: str
    """Why it stopped taking groups (its goal was met); empty while it trains."""
    message: str | None = None
    """What to do when none is connected."""


class HealthResponse(BaseModel):
    status: Literal["ok", "degraded", "dead"]
    engine: str
    model: str
    model_path: str
    policy_version: int
    server_id: str
    redis: RedisState
    running: int
    waiting: int
    engine_error: str | None = None
    """Why the engine died ("status": "dead"): the server is stopping and exits non-zero."""
    warnings: list[str] = []
    """What a person must know about this server: e.g. ``insecure_no_auth`` (it listens
    beyond loopback with no API key)."""
    learner: LearnerHealth | None = None
    """The learner as the queue shows it (None: this server runs without admission)."""


@router.get("/health", response_model=HealthResponse,
            responses={503: {"model": HealthResponse,
                             "description": "The engine died (the server is stopping), "
                                            "or Redis is unreachable or refusing writes"}})
async def health(request: Request, settings: SettingsDep, engine: EngineDep, redis: RedisDep,
                 keys: KeysDep) -> JSONResponse:
    redis_state = await _probe_redis(redis, keys, settings.server_id)
    redis_ok = redis_state == "ok"
    dead = engine.dead_reason()
    stats = engine.stats()
    body = HealthResponse(
        status="dead" if dead else "ok" if redis_ok else "degraded", engine=engine.name,
        model=settings.model_name, model_path=engine.model_path,
        policy_version=engine.policy_version, server_id=settings.server_id,
        redis=redis_state, running=stats.running,
        waiting=stats.waiting, engine_error=dead, warnings=settings.security_warnings,
        learner=await _learner(request) if redis_ok else None,
    )
    return JSONResponse(body.model_dump(), status_code=200 if redis_ok and not dead else 503)


async def _learner(request: Request) -> LearnerHealth | None:
    """From the admission gate's latest read of the queue (at most 50 ms old)."""
    gate = getattr(request.app.state, "admission", None)
    if gate is None:
        return None
    try:
        snap = await gate.snapshot()
    except (redis.exceptions.RedisError, OSError):
        return None
    age = snap.learner_age_s
    connected = learner_connected(age)
    return LearnerHealth(connected=connected, last_seen_s=None if age is None else round(age, 1),
                         version=snap.learner.version, finished=snap.learner.finished,
                         message=None if connected else no_learner_text(age))


async def _probe_redis(client: Redis, keys: Keys, server_id: str) -> RedisState:
    """"ok", "out_of_memory" (writes refused) or "unreachable"."""
    key = f"{keys.prefix}:server:{server_id}:health"
    try:
        await asyncio.wait_for(client.set(key, b"1", px=PROBE_TTL_MS), REDIS_PING_TIMEOUT_S)
    except redis.exceptions.OutOfMemoryError:
        return "out_of_memory"
    except (TimeoutError, redis.exceptions.RedisError, OSError):
        return "unreachable"
    return "ok"
