"""``GET /metrics``: the app's Prometheus registry in the text exposition format (open, like
every Prometheus target; it carries counts and timings, no request content)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from server.deps import EngineDep, MetricsDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
async def metrics(metrics: MetricsDep, engine: EngineDep) -> Response:
    return Response(metrics.render(engine), media_type=CONTENT_TYPE_LATEST)
