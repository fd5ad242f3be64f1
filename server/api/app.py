"""The rollout server's app factory: one engine, one Redis, the HTTP API in front of them.

``create_app(settings)`` builds the app; everything with a lifetime (the engine, the Redis
pool, the store, the sweeper and the registry heartbeat) is created in ``lifespan`` and put
on ``app.state``, in that order, and torn down in reverse. Routes reach it through the
``Annotated`` dependencies of ``gspo_rl.server.api.deps``: each resource's one serving object
(``gspo_rl.server.rollouts.serving``, built by ``build_serving``: chat, completions, rollouts
over one ``SamplingService``; groups, rewards, evals, tasks, models, health, the admin
weights), as ``app.state.serving_<resource>``.

Route guards (``gspo_rl.server.api.auth``): ``/health``, ``/metrics`` and the dashboard's
page (``/dashboard``: no data) are open; every ``/v1`` route (``/v1/models`` too, as OpenAI
and vLLM guard it, and the dashboard's data) requires the API key (when one is set);
``/admin`` routes (weights) require the separate admin key; both are checked before a
request's body is read.

A dead engine (``Engine.dead_reason``) is watched for (``gspo_rl.server.run``): ``/health``
turns 503, and the server stops with a non-zero exit status so that it is restarted.

Engines are pluggable (``settings.engine``) and imported only when chosen, so the hf engine
never imports vLLM. Tests and benchmarks may pass an engine in; the app starts and shuts it
down like one it built.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI

from gspo_rl.contract.chat.sanitize import warm as warm_chat_encoders
from gspo_rl.contract.gc_freeze import freeze_startup_objects
from gspo_rl.contract.schema import Keys
from gspo_rl.redisq.client import make_redis
from gspo_rl.redisq.episodes.store import EpisodeStore
from gspo_rl.redisq.inflight import InFlightCounter
from gspo_rl.redisq.registry import Load, ServerInfo, heartbeat_loop
from gspo_rl.server.api.auth import BearerAuthMiddleware
from gspo_rl.server.api.dashboard.state import DashboardService
from gspo_rl.server.api.deps import require_admin_key, require_api_key
from gspo_rl.server.api.disconnect import CancelOnDisconnectMiddleware
from gspo_rl.server.api.errors import install_error_handlers
from gspo_rl.server.api.limits import check_request_json
from gspo_rl.server.api.openapi import install_openapi
from gspo_rl.server.api.request_metrics import RequestMetricsMiddleware
from gspo_rl.server.api.routes import (
    admin,
    chat,
    completions,
    dashboard,
    evals,
    groups,
    health,
    metrics,
    models,
    rewards,
    rollouts,
    tasks,
)
from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.base import Engine
from gspo_rl.server.engines.updates import WeightUpdates
from gspo_rl.server.metrics import ServerMetrics
from gspo_rl.server.rollouts.admission import AdmissionGate
from gspo_rl.server.rollouts.chat.render import TokenTexts
from gspo_rl.server.rollouts.service import SamplingService
from gspo_rl.server.rollouts.serving.chat import ChatServing
from gspo_rl.server.rollouts.serving.completions import CompletionServing
from gspo_rl.server.rollouts.serving.evals import EvalServing
from gspo_rl.server.rollouts.serving.groups import GroupServing
from gspo_rl.server.rollouts.serving.health import HealthServing
from gspo_rl.server.rollouts.serving.models import ModelServing
from gspo_rl.server.rollouts.serving.rewards import RewardServing
from gspo_rl.server.rollouts.serving.rollouts import RolloutServing
from gspo_rl.server.rollouts.serving.tasks import TaskServing
from gspo_rl.server.rollouts.serving.weights import WeightServing
from gspo_rl.server.run import watch_engine

log = logging.getLogger(__name__)
SHUTDOWN_TIMEOUT_S = 10.0
SAMPLING_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/rollouts")
"""Routes whose generation is aborted when the client disconnects
(``gspo_rl.server.api.disconnect``)."""
WATCHED_PATHS = (*SAMPLING_PATHS, "/v1/groups")
"""Also ``POST /v1/groups``: held by admission for up to ``admission_wait_s``, a request whose
client has gone stops waiting (a graceful shutdown would wait for it)."""


def build_engine(settings: ServerSettings) -> Engine:
    """The engine ``settings.engine`` names (imported here, only when chosen)."""
    import torch

    dtype = settings.resolved_dtype(torch.cuda.is_available())
    if settings.engine == "hf":
        from gspo_rl.server.engines.hf.engine import HFEngine

        return HFEngine(settings.model, max_batch_size=settings.max_batch_size,
                        device=settings.device, dtype=getattr(torch, dtype),
                        max_model_len=settings.max_model_len)
    from gspo_rl.server.engines.vllm.engine import VLLMEngine

    return VLLMEngine(settings.model, max_batch_size=settings.max_batch_size, dtype=dtype,
                      max_model_len=settings.max_model_len,
                      tensor_parallel_size=settings.tensor_parallel_size,
                      gpu_memory_utilization=settings.gpu_memory_utilization,
                      enforce_eager=settings.enforce_eager,
                      engine_args=dict(settings.vllm_args),
                      max_lora_rank=settings.max_lora_rank)


def load_tokenizer(engine: Engine) -> Any:
    """The engine's own tokenizer when it has one (same object, same ids), else the model's."""
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(engine.model_path)
    return tokenizer


def build_serving(app: FastAPI, engine: Engine, store: EpisodeStore,
                  settings: ServerSettings) -> None:
    """The tokenizer, the sampling service and one serving object per resource, on
    ``app.state`` (the routes' dependencies read them there); after the engine, Redis and
    the admission gate."""
    state = app.state
    state.tokenizer = load_tokenizer(engine)
    warm_chat_encoders(state.tokenizer)
    state.token_texts = TokenTexts(state.tokenizer)
    state.sampling = SamplingService(engine, store, state.tokenizer, state.token_texts,
                                     settings, state.metrics)
    state.serving_chat = ChatServing(state.sampling)
    state.serving_completions = CompletionServing(state.sampling)
    state.serving_rollouts = RolloutServing(state.sampling)
    state.serving_groups = GroupServing(store, settings, state.metrics, state.tokenizer, engine)
    state.serving_rewards = RewardServing(store)
    state.serving_weights = WeightServing(engine, state.weight_updates)
    state.serving_evals = EvalServing(state.redis, state.keys)
    state.serving_tasks = TaskServing(state.redis, state.keys)
    state.serving_models = ModelServing(settings, engine, state.started_at)
    state.serving_health = HealthServing(settings, engine, state.redis, state.keys,
                                         state.admission)


def engine_load(engine: Engine) -> Load:
    """The engine's load as the registry's heartbeat carries it (the dashboard's servers)."""
    stats = engine.stats()
    return Load(running=stats.running, waiting=stats.waiting)


def advertised_url(settings: ServerSettings) -> str:
    """The base URL the learner uses to reach this server's admin routes."""
    if settings.advertise_url:
        return settings.advertise_url.rstrip("/")
    host = settings.host if settings.host not in ("0.0.0.0", "::", "") else socket.getfqdn()
    return f"http://{host}:{settings.port}"


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(task, SHUTDOWN_TIMEOUT_S)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: ServerSettings = app.state.settings
    engine: Engine = app.state.injected_engine or build_engine(settings)
    redis = make_redis(settings.redis_url)
    tasks: list[asyncio.Task[Any]] = []
    store: EpisodeStore | None = None
    try:
        await redis.ping()  # fail at start-up, not at the first rollout
        keys = Keys(settings.key_prefix)
        store = EpisodeStore(redis, keys, settings.queue)  # a RolloutStore plus episodes
        await engine.start()
        app.state.engine, app.state.redis, app.state.keys, app.state.store = (
            engine, redis, keys, store)
        counter = InFlightCounter(redis, keys, settings.server_id, store.pipe,
                                  no_signal_hold_s=settings.no_signal_hold_s,
                                  no_signal_drought_s=settings.no_signal_drought_s)
        gate = AdmissionGate(counter, settings, app.state.metrics,
                             lambda: engine.policy_version,
                             weight_status=app.state.weight_updates.describe)
        app.state.admission = gate
        app.state.dashboard = DashboardService(settings, keys)  # GET /v1/dashboard/*
        tasks.append(asyncio.create_task(counter.publish_loop(lambda: gate.local)))
        build_serving(app, engine, store, settings)
        tasks.append(asyncio.create_task(store.run_sweeper(settings.sweep_interval_s)))
        tasks.append(asyncio.create_task(  # dead: 503s, then stop, exit != 0
            watch_engine(app, engine, settings.engine_dead_exit_delay_s)))
        info = ServerInfo(server_id=settings.server_id, url=advertised_url(settings),
                          engine=engine.name, model=settings.model_name,
                          ranks=engine.weight_ranks())
        admin_key = settings.admin_key.get_secret_value() if settings.admin_key else None
        tasks.append(asyncio.create_task(heartbeat_loop(
            redis, keys, info, admin_key=admin_key, version=lambda: engine.policy_version,
            load=lambda: engine_load(engine),
            weight_sync=app.state.weight_updates.sync_state)))
        log.info("serving %s (%s engine) as %r", engine.model_path, engine.name,
                 settings.model_name)
        for warning in settings.security_warnings:
            log.warning("INSECURE: %s", warning)
        freeze_startup_objects()
        yield
    finally:
        gc.unfreeze()  # collectable again (tests start and stop apps in one process)
        for task in reversed(tasks):
            await _cancel(task)
        started = getattr(app.state, "admission", None)
        if started is not None:
            await started.counter.withdraw()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(engine.shutdown(), SHUTDOWN_TIMEOUT_S)
        if store is not None:
            await store.aclose()
        await redis.aclose()


def create_app(settings: ServerSettings, engine: Engine | None = None) -> FastAPI:
    """The rollout server's FastAPI app (see the module docstring)."""
    app = FastAPI(title="gspo-rl rollout server", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.injected_engine = engine
    app.state.metrics = ServerMetrics()
    app.state.weight_updates = WeightUpdates()  # said while they wait, and when refusing
    app.state.started_at = int(time.time())  # GET /v1/models' "created"
    app.state.engine_dead = None  # why the engine died, once it has (gspo_rl.server.run)
    app.state.exit_code = 0  # the process's exit status once uvicorn stops (run_server)
    app.state.stop_server = None  # set by run_server: a graceful stop from inside the app
    app.add_middleware(  # innermost: cancels the handler, the error handlers stay outside
        CancelOnDisconnectMiddleware, paths=WATCHED_PATHS,
        on_disconnect=lambda path: app.state.metrics.disconnected.labels(path).inc())
    install_error_handlers(app, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(BearerAuthMiddleware, settings=settings,  # before a body byte is read
                       routes=app.router.routes)
    app.add_middleware(RequestMetricsMiddleware, metrics=app.state.metrics)  # outermost
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(dashboard.page_router)  # the page, open: its data is under /v1
    api_guard = [Depends(require_api_key), Depends(check_request_json)]  # key first
    for module in (chat, completions, rollouts, rewards, groups, models, evals, tasks,
                   dashboard):
        app.include_router(module.router, dependencies=api_guard)
    app.include_router(admin.router, dependencies=[Depends(require_admin_key)])
    install_openapi(app, settings)  # the document says what this server accepts
    return app
