"""FastAPI dependencies: what a route may ask for, all taken from ``app.state`` (created in the
app's lifespan, never lazily), and the two keys that guard the routes. A route asks for the
one serving object of its resource (``gspo_rl.server.rollouts.serving``). The one exception
to "never lazily": an app that serves only the queue (``app.state.store`` alone, with the
groups and rewards routers: the tests' and benchmarks' queue apps) gets those two serving
objects built over its store on first use.

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

from gspo_rl.redisq.groups.store import RolloutStore
from gspo_rl.server.api.auth import Guard, key_error
from gspo_rl.server.api.limits import parsed_body
from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.sampler import SamplingEngine
from gspo_rl.server.metrics import ServerMetrics
from gspo_rl.server.rollouts.admission import AdmissionGate
from gspo_rl.server.rollouts.serving.chat import ChatServing, plain_call
from gspo_rl.server.rollouts.serving.completions import CompletionServing
from gspo_rl.server.rollouts.serving.evals import EvalServing
from gspo_rl.server.rollouts.serving.groups import GroupServing
from gspo_rl.server.rollouts.serving.health import HealthServing
from gspo_rl.server.rollouts.serving.models import ModelServing
from gspo_rl.server.rollouts.serving.rewards import RewardServing
from gspo_rl.server.rollouts.serving.rollouts import RolloutServing
from gspo_rl.server.rollouts.serving.tasks import TaskServing
from gspo_rl.server.rollouts.serving.weights import WeightServing

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <key>")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def get_settings(request: Request) -> ServerSettings:
    return request.app.state.settings


async def get_engine(request: Request) -> SamplingEngine:
    """The engine's sampling half, as the read-only routes use it (metrics, dashboard)."""
    return request.app.state.engine


async def get_store(request: Request) -> RolloutStore:
    return request.app.state.store


async def get_chat(request: Request) -> ChatServing:
    return request.app.state.serving_chat


async def get_completions(request: Request) -> CompletionServing:
    return request.app.state.serving_completions


async def get_rollouts(request: Request) -> RolloutServing:
    return request.app.state.serving_rollouts


async def get_groups(request: Request) -> GroupServing:
    state = request.app.state
    if getattr(state, "serving_groups", None) is None:  # a queue-only app (module docstring)
        state.serving_groups = GroupServing(state.store)
    return state.serving_groups


async def get_rewards(request: Request) -> RewardServing:
    state = request.app.state
    if getattr(state, "serving_rewards", None) is None:  # a queue-only app (module docstring)
        state.serving_rewards = RewardServing(state.store)
    return state.serving_rewards


async def get_weights(request: Request) -> WeightServing:
    return request.app.state.serving_weights


async def get_evals(request: Request) -> EvalServing:
    return request.app.state.serving_evals


async def get_tasks(request: Request) -> TaskServing:
    return request.app.state.serving_tasks


async def get_models(request: Request) -> ModelServing:
    return request.app.state.serving_models


async def get_health(request: Request) -> HealthServing:
    return request.app.state.serving_health


async def get_redis(request: Request) -> Redis:
    return request.app.state.redis


async def get_admission(request: Request) -> AdmissionGate | None:
    """The ready-queue bound, or None in an app that does not bound it."""
    return getattr(request.app.state, "admission", None)


async def get_optional_tokenizer(request: Request) -> Any | None:
    """The tokenizer, or None in an app that serves only the queue (rewards and groups)."""
    return getattr(request.app.state, "tokenizer", None)


async def get_metrics(request: Request) -> ServerMetrics:
    return request.app.state.metrics


SettingsDep = Annotated[ServerSettings, Depends(get_settings)]
EngineDep = Annotated[SamplingEngine, Depends(get_engine)]
StoreDep = Annotated[RolloutStore, Depends(get_store)]
ChatDep = Annotated[ChatServing, Depends(get_chat)]
CompletionsDep = Annotated[CompletionServing, Depends(get_completions)]
RolloutsDep = Annotated[RolloutServing, Depends(get_rollouts)]
GroupsDep = Annotated[GroupServing, Depends(get_groups)]
RewardsDep = Annotated[RewardServing, Depends(get_rewards)]
WeightsDep = Annotated[WeightServing, Depends(get_weights)]
EvalsDep = Annotated[EvalServing, Depends(get_evals)]
TasksDep = Annotated[TaskServing, Depends(get_tasks)]
ModelsDep = Annotated[ModelServing, Depends(get_models)]
HealthDep = Annotated[HealthServing, Depends(get_health)]
RedisDep = Annotated[Redis, Depends(get_redis)]
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
