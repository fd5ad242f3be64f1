"""FastAPI dependencies: what a route may ask for, all taken from ``app.state`` (created in the
app's lifespan, never lazily), and the two keys that guard the routes.

The keys (``gspo_rl.server.api.auth``) are checked before a body is read, by
``BearerAuthMiddleware``; ``require_api_key`` / ``require_admin_key`` check them again through
``HTTPBearer``, which is what puts the security scheme in the OpenAPI document.

Every dependency is ``async def`` although none awaits: FastAPI runs a plain ``def``
dependency in a worker thread, and with the engine's thread holding the GIL each such hop
waits for a GIL hand-off (measured: docs/design/hf-engine.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis.asyncio import Redis

from gspo_rl.contract.queue.groups.store import RolloutStore
from gspo_rl.contract.queue.schema import Keys
from gspo_rl.server.api.auth import Guard, key_error
from gspo_rl.server.api.limits import parsed_body
from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.base import Engine
from gspo_rl.server.metrics import ServerMetrics
from gspo_rl.server.rollouts.admission import AdmissionGate
from gspo_rl.server.rollouts.service import SamplingService
from gspo_rl.server.rollouts.serving.chat import plain_call

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <key>")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def get_settings(request: Request) -> ServerSettings:
    return request.app.state.settings


async def get_engine(request: Request) -> Engine:
    return request.app.state.engine


async def get_store(request: Request) -> RolloutStore:
    return request.app.state.store


async def get_sampling(request: Request) -> SamplingService:
    return request.app.state.sampling


async def get_redis(request: Request) -> Redis:
    return request.app.state.redis


async def get_keys(request: Request) -> Keys:
    return request.app.state.keys


async def get_admission(request: Request) -> AdmissionGate | None:
    """The ready-queue bound, or None in an app that does not bound it."""
    return getattr(request.app.state, "admission", None)


async def get_optional_tokenizer(request: Request) -> Any | None:
    """The tokenizer, or None in an app that serves only the queue (rewards and groups)."""
    return getattr(request.app.state, "tokenizer", None)


async def get_metrics(request: Request) -> ServerMetrics:
    return request.app.state.metrics


SettingsDep = Annotated[ServerSettings, Depends(get_settings)]
EngineDep = Annotated[Engine, Depends(get_engine)]
StoreDep = Annotated[RolloutStore, Depends(get_store)]
SamplingDep = Annotated[SamplingService, Depends(get_sampling)]
RedisDep = Annotated[Redis, Depends(get_redis)]
KeysDep = Annotated[Keys, Depends(get_keys)]
AdmissionDep = Annotated[AdmissionGate | None, Depends(get_admission)]
OptionalTokenizerDep = Annotated[Any | None, Depends(get_optional_tokenizer)]
MetricsDep = Annotated[ServerMetrics, Depends(get_metrics)]


def _check(settings: ServerSettings, guard: Guard,
           credentials: HTTPAuthorizationCredentials | None) -> None:
    error = key_error(settings, guard, None if credentials is None else credentials.credentials)
    if error is not None:
        raise error


async def require_api_key(settings: SettingsDep, credentials: BearerDep) -> None:
    """Guards every ``/v1`` route when ``api_key`` is set."""
    _check(settings, "api", credentials)


async def require_admin_key(settings: SettingsDep, credentials: BearerDep) -> None:
    """Guards weight-update and admin routes with the separate admin key."""
    _check(settings, "admin", credentials)


async def admit_new_group(request: Request) -> AsyncIterator[None]:
    """Dependency of the routes that start a group (``gspo_rl.server.rollouts.admission``): held
    until admitted, counted until the request ends. Let through: a chat request carrying a
    ``rollout_id`` (it continues an accepted episode), a request with ``"record": false`` and a
    plain chat call (both start no group: served also when new groups are refused;
    ``gspo_rl.server.rollouts.serving.chat.plain_call``)."""
    gate: AdmissionGate | None = getattr(request.app.state, "admission", None)
    if gate is None or await _starts_no_group(request):
        yield
        return
    counted = await gate.admit(request.url.path)
    try:
        yield
    finally:
        if counted:
            await gate.release()


async def _starts_no_group(request: Request) -> bool:
    """An unrecorded request, or one more turn of an episode. Outside chat the body is parsed
    only when its bytes hold ``"record"`` (parsed once: FastAPI reuses it)."""
    chat = request.url.path == "/v1/chat/completions"
    if not chat and b'"record"' not in await request.body():
        return False
    body = await parsed_body(request)
    if not isinstance(body, dict):
        return False
    if body.get("record") is False:
        return True
    return chat and (body.get("rollout_id") is not None
                     or plain_call(None, body.get("n"), "record" in body))
