"""``GET /health``: is this server ready to sample and record, and with which weights.

Open (no key): load balancers and the tests' start-up wait poll it. 503 unless the status is
``"ok"``: a server that cannot record rollouts (Redis unreachable or refusing writes) is not
serving its purpose, and a dead engine (``"status": "dead"``, ``gspo_rl.server.run``) never
will again. The checks are ``HealthServing``'s (``gspo_rl.server.rollouts.serving.health``).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gspo_rl.server.api.deps import HealthDep
from gspo_rl.server.rollouts.protocol.health import HealthResponse

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthResponse,
            responses={503: {"model": HealthResponse,
                             "description": "The engine died (the server is stopping), "
                                            "or Redis is unreachable or refusing writes"}})
async def health(serving: HealthDep) -> JSONResponse:
    body = await serving.check()
    return JSONResponse(body.model_dump(), status_code=200 if body.status == "ok" else 503)
