"""Helpers for the queue tests: rollouts, an event loop in a thread, a real uvicorn app.

The API tests serve a minimal FastAPI app (the reward and group routers, the error handlers,
a ``RolloutStore`` made in the lifespan) with real uvicorn on a free port, on an event loop
in a background thread; the test drives it over HTTP and sets up groups through the same
loop's store.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import numpy as np
import redis
import redis.asyncio as aioredis
import uvicorn
from fastapi import FastAPI

from gspo_rl.contract.schema import (
    READY_STREAM_FIELD,
    Keys,
    ReadyGroup,
    RolloutRecord,
    as_str,
    join_ready_group,
    member_of,
    unpack_ready_group,
    unpack_rollout,
)
from gspo_rl.redisq.client import make_redis
from gspo_rl.redisq.groups.store import QueueConfig, RewardItem, RolloutStore
from gspo_rl.redisq.ready.entry import (
    entry_record_bytes,
    ready_entry_refs,
    unpack_group_records,
)
from gspo_rl.server.api.errors import install_error_handlers
from gspo_rl.server.api.routes import groups, rewards
from tests.conftest import free_port, wait_for_port

T = TypeVar("T")


def make_rollout(
    rollout_id: str, group_id: str, n_tokens: int = 16, prompt_len: int = 4, version: int = 0,
    seed: int = 0,
) -> RolloutRecord:
    """A rollout whose sampled tokens (after the prompt) all carry policy ``version``."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(n_tokens, np.uint8)
    mask[prompt_len:] = 1
    versions = np.where(mask == 1, version, -1).astype(np.int32)
    logprobs = np.where(mask == 1, -rng.random(n_tokens), 0.0).astype(np.float32)
    return RolloutRecord(
        rollout_id=rollout_id, group_id=group_id,
        token_ids=rng.integers(0, 50_000, n_tokens).astype(np.int32), loss_mask=mask,
        logprobs=logprobs, versions=versions, prompt_len=prompt_len,
        turns=[(prompt_len, n_tokens)], finish_reason="stop",
    )


class LoopThread:
    """An asyncio loop running in a daemon thread; ``run`` waits for a coroutine (bounded)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def make_app(redis_url: str, config: QueueConfig, keys: Keys, max_body_bytes: int,
             sweeper_interval_s: float | None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = make_redis(redis_url)
        app.state.store = RolloutStore(client, keys, config)
        task = None
        if sweeper_interval_s is not None:
            task = asyncio.create_task(app.state.store.run_sweeper(sweeper_interval_s))
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await app.state.store.aclose()
            await client.aclose()

    app = FastAPI(lifespan=lifespan)
    install_error_handlers(app, max_body_bytes=max_body_bytes)
    app.include_router(rewards.router)
    app.include_router(groups.router)
    return app


class ApiServer:
    """The minimal app under real uvicorn, on a free port, in a ``LoopThread``."""

    def __init__(self, redis_url: str, config: QueueConfig | None = None,
                 keys: Keys | None = None, max_body_bytes: int = 1 << 20,
                 sweeper_interval_s: float | None = None) -> None:
        self.port = free_port()
        self.app = make_app(redis_url, config or QueueConfig(), keys or Keys(), max_body_bytes,
                            sweeper_interval_s)
        self.loop = LoopThread()
        self.server = uvicorn.Server(uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"))
        self._serving = asyncio.run_coroutine_threadsafe(self.server.serve(), self.loop.loop)
        wait_for_port(self.port, timeout=20)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def store(self) -> RolloutStore:
        return self.app.state.store

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Runs a coroutine on the server's loop (where ``store``'s client lives)."""
        return self.loop.run(coro, timeout)

    def close(self) -> None:
        self.server.should_exit = True
        self._serving.result(timeout=20)
        self.loop.close()


async def open_group(store: RolloutStore, group_id: str, size: int, n_tokens: int = 16,
                     version: int = 0, n_recorded: int | None = None) -> list[str]:
    """Creates a group and records ``n_recorded`` (default all) rollouts; returns their ids."""
    await store.create_group(group_id, size, {"prompt": group_id})
    ids = [f"{group_id}-r{i}" for i in range(size if n_recorded is None else n_recorded)]
    for i, rid in enumerate(ids):
        await store.record_rollout(make_rollout(rid, group_id, n_tokens, version=version,
                                                seed=i))
    return ids


async def publish_groups(redis_url: str, group_ids: list[str], size: int = 4,
                         version: int = 0, n_tokens: int = 16,
                         keys: Keys | None = None) -> list[str]:
    """Creates, fills and rewards groups (distinct rewards) so that each is published, in
    order; returns their stream ids."""
    client = make_redis(redis_url)
    try:
        store = RolloutStore(client, keys or Keys())
        stream_ids = []
        for gid in group_ids:
            ids = await open_group(store, gid, size, n_tokens=n_tokens, version=version)
            outcome = await store.post_rewards(
                [RewardItem(rid, float(i)) for i, rid in enumerate(ids)])
            assert outcome.applied and outcome.results[-1].group_complete
            view = await store.get_group(gid)
            assert view is not None and view.stream_id is not None
            stream_ids.append(view.stream_id)
        return stream_ids
    finally:
        await client.aclose()


def ready_records(client: redis.Redis, keys: Keys | None = None) -> list[tuple[str, bytes]]:
    """Every ready-stream entry as (id, the ``pack_ready_group`` bytes the learner reads): a
    by-reference entry's head joined with its rollout records (a missing one: KeyError)."""
    keys = keys or Keys()
    out = []
    for raw_id, fields in client.xrange(keys.ready_stream):
        entry_id = as_str(raw_id)
        ref = ready_entry_refs(keys, fields)
        if ref is None:
            out.append((entry_id, fields[READY_STREAM_FIELD.encode()]))
            continue
        records = entry_record_bytes(ref, client.mget(ref.keys))
        if records is None:
            raise KeyError(f"entry {entry_id}: rollout records missing")
        out.append((entry_id, join_ready_group(ref.head, records)))
    return out


async def aready_records(client: aioredis.Redis,
                         keys: Keys | None = None) -> list[tuple[str, bytes]]:
    """``ready_records`` with an asyncio client."""
    keys = keys or Keys()
    out = []
    for raw_id, fields in await client.xrange(keys.ready_stream):
        entry_id = as_str(raw_id)
        ref = ready_entry_refs(keys, fields)
        if ref is None:
            out.append((entry_id, fields[READY_STREAM_FIELD.encode()]))
            continue
        records = entry_record_bytes(ref, await client.mget(ref.keys))
        if records is None:
            raise KeyError(f"entry {entry_id}: rollout records missing")
        out.append((entry_id, join_ready_group(ref.head, records)))
    return out


def ready_groups(client: redis.Redis, keys: Keys | None = None) -> list[ReadyGroup]:
    """Every group on the ready stream, decoded, in stream order."""
    return [unpack_ready_group(data) for _, data in ready_records(client, keys)]


def stored_rollout(client: redis.Redis, rollout_id: str,
                   keys: Keys | None = None) -> RolloutRecord | None:
    """A rollout's stored record (None: none, or expired): its own key (a multi-turn
    episode's), else its group's one records key (a sampled group's), found through the
    rollout -> group mapping or the id itself (``member_rollout_id``)."""
    keys = keys or Keys()
    raw = client.get(keys.rollout(rollout_id))
    if raw is not None:
        return unpack_rollout(raw)
    mapped = client.get(keys.rollout_group(rollout_id))
    member = member_of(rollout_id)
    gid = as_str(mapped) if mapped is not None else member[0] if member else None
    whole = client.get(keys.group_records(gid)) if gid is not None else None
    recs = unpack_group_records(whole) if whole is not None else []
    return next((r for r in recs if r.rollout_id == rollout_id), None)
