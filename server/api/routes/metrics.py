"""``GET /metrics``: the app's Prometheus registry in the text exposition format (open, like
every Prometheus target; it carries counts and timings, no request content)."""

from __future__ import annotations

import asyncio
import contextlib

import redis.exceptions
from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gspo_rl.server.api.deps import AdmissionDep, EngineDep, MetricsDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
async def metrics(metrics: MetricsDep, engine: EngineDep, gate: AdmissionDep) -> Response:
    if gate is not None:
        # Queue depth and groups in flight are read from Redis: /metrics still answers
        # while Redis is down.
        with contextlib.suppress(TimeoutError, redis.exceptions.RedisError, OSError):
            await asyncio.wait_for(gate.refresh_gauges(), 1.0)
    return Response(metrics.render(engine), media_type=CONTENT_TYPE_LATEST)
