"""``GET /health``: is this server ready to sample and record, and with which weights.

Open (no key): load balancers and the tests' start-up wait poll it. It pings Redis with a short
timeout because a server that cannot record rollouts is not serving its purpose: 503 then.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import redis.exceptions
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from server.deps import EngineDep, SettingsDep

router = APIRouter(tags=["health"])
REDIS_PING_TIMEOUT_S = 1.0


class HealthResponse(BaseModel):
    status: Literal["ok", "degraded"]
    engine: str
    model: str
    model_path: str
    policy_version: int
    server_id: str
    redis: Literal["ok", "unreachable"]
    running: int
    waiting: int


@router.get("/health", response_model=HealthResponse,
            responses={503: {"model": HealthResponse, "description": "Redis unreachable"}})
async def health(request: Request, settings: SettingsDep, engine: EngineDep) -> JSONResponse:
    redis_ok = True
    try:
        await asyncio.wait_for(request.app.state.redis.ping(), REDIS_PING_TIMEOUT_S)
    except (TimeoutError, redis.exceptions.RedisError, OSError):
        redis_ok = False
    stats = engine.stats()
    body = HealthResponse(
        status="ok" if redis_ok else "degraded", engine=engine.name,
        model=settings.model_name, model_path=engine.model_path,
        policy_version=engine.policy_version, server_id=settings.server_id,
        redis="ok" if redis_ok else "unreachable", running=stats.running,
        waiting=stats.waiting,
    )
    return JSONResponse(body.model_dump(), status_code=200 if redis_ok else 503)
