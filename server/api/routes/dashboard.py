"""The live dashboard: the page (``GET /dashboard``) and the JSON it polls (``/v1/dashboard``).

``page_router`` serves the page and its script and style sheet, shipped as package data
(``gspo_rl.server.api.dashboard/static``; no CDN: deployments are offline). It is open like
``/health``: it holds no data. ``router`` serves the data, under ``/v1``, so the API key guards
it (when the server has one). The page reads the key from its URL's fragment
(``/dashboard#key=...``, never sent to a server, so never in an access log), keeps it in the
tab's session storage and sends it as ``Authorization: Bearer``; without one it asks for it.
Read-only: nothing here writes to Redis or the engine (docs/dashboard.md).
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import Response

from gspo_rl.server.api.dashboard.protocol import DashboardState, GroupDetail, GroupList
from gspo_rl.server.api.dashboard.recent import refresh_quietly
from gspo_rl.server.api.dashboard.render import group_detail
from gspo_rl.server.api.dashboard.state import DashboardService
from gspo_rl.server.api.deps import (
    AdmissionDep,
    EngineDep,
    OptionalTokenizerDep,
    RedisDep,
    StoreDep,
)
from gspo_rl.server.api.error_docs import error_responses
from gspo_rl.server.api.errors import APIError

router = APIRouter(tags=["dashboard"])
page_router = APIRouter(include_in_schema=False)
ASSETS = {name: f"{kind}; charset=utf-8" for name, kind in (
    ("dashboard.js", "text/javascript"), ("panels.js", "text/javascript"),
    ("rollouts.js", "text/javascript"), ("dashboard.css", "text/css"))}
_STATIC = resources.files("gspo_rl.server.api.dashboard") / "static"
_FILES = {name: (_STATIC / name).read_bytes() for name in ("index.html", *ASSETS)}
HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


async def get_dashboard(request: Request) -> DashboardService:
    return request.app.state.dashboard


DashboardDep = Annotated[DashboardService, Depends(get_dashboard)]


@page_router.get("/dashboard")
async def page() -> Response:
    """The dashboard's page."""
    return Response(_FILES["index.html"], media_type="text/html; charset=utf-8",
                    headers=HEADERS)


@page_router.get("/dashboard/{name}")
async def asset(name: str) -> Response:
    """The page's script and style sheet."""
    if name not in ASSETS:
        raise APIError(404, f"no dashboard file {name!r}", code="not_found")
    return Response(_FILES[name], media_type=ASSETS[name], headers=HEADERS)


@router.get("/v1/dashboard/state", response_model=DashboardState,
            responses=error_responses(401, 422, 503))
async def dashboard_state(dashboard: DashboardDep, engine: EngineDep, redis: RedisDep,
                          gate: AdmissionDep) -> DashboardState:
    """The run at a glance: the learner, the servers, the queue, group fates, rewards,
    throughput and evaluations (each number's source: docs/dashboard.md)."""
    return await dashboard.state(engine, redis, gate)


@router.get("/v1/dashboard/groups", response_model=GroupList,
            responses=error_responses(401, 422, 503))
async def dashboard_groups(dashboard: DashboardDep, redis: RedisDep,
                           limit: Annotated[int, Query(ge=1, le=50)] = 20) -> GroupList:
    """The groups that ended most recently (published or dropped for equal rewards), newest
    first, with their rewards and advantages."""
    await refresh_quietly(dashboard.recent, redis)
    return GroupList(groups=dashboard.recent.list(limit))


@router.get("/v1/dashboard/groups/{group_id}", response_model=GroupDetail,
            responses=error_responses(401, 404, 422, 501, 503))
async def dashboard_group(
    group_id: Annotated[str, Path(min_length=1, max_length=256)], dashboard: DashboardDep,
    store: StoreDep, tokenizer: OptionalTokenizerDep, request: Request,
    rollouts: Annotated[int, Query(ge=1, le=64)] = 16,
    max_tokens: Annotated[int, Query(ge=1, le=4096)] = 512,
) -> GroupDetail:
    """A group's episodes turn by turn: each model token decoded, with its log-probability,
    policy version and its turn's advantage; the context between turns as text. 404 for an
    unknown group, or one whose records have expired."""
    texts = getattr(request.app.state, "token_texts", None)
    if tokenizer is None or texts is None:
        raise APIError(501, "this server has no tokenizer to decode trajectories",
                       code="tokens_unsupported")
    out = await group_detail(store, dashboard.recent, tokenizer, texts, group_id, rollouts,
                             max_tokens)
    if out is None:
        raise APIError(404, f"unknown group {group_id!r} (never created, or expired)",
                       code="unknown_group")
    return out
