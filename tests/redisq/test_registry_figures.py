"""What each heartbeat carries besides the server's address (``gspo_rl.redisq.registry``): the
engine's load and its current or last weight update (``WeightUpdates.sync_state``), read anew
for each beat, signed with the rest; a figure that cannot be read does not stop the beat; a
registration without them (an older server's) still parses, without them.

Real parts: a real redis-server, the real heartbeat loop, real ``WeightUpdates`` tracking
receives that load, wait and fail.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
import redis
import redis.asyncio as aredis

from gspo_rl.contract.schema import Keys
from gspo_rl.redisq.registry import (
    Load,
    ServerInfo,
    heartbeat_loop,
    parse_registration,
    read_registry,
)
from gspo_rl.server.engines.updates import WeightUpdates
from tests.conftest import RedisServer

KEY = "the-admin-key"
KEYS = Keys("figures")
INFO = ServerInfo(server_id="s1", url="http://127.0.0.1:9", engine="hf", model="tiny")


def registered(r: redis.Redis) -> ServerInfo:
    (info,) = read_registry(r, KEYS, KEY).servers  # verifies the signature
    return info


def sync_state(r: redis.Redis) -> str | None:
    sync = registered(r).weight_sync
    return None if sync is None else sync.state


async def until(cond: Callable[[], object], what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.02)


def test_each_beat_carries_the_load_and_the_weight_update(redis_server: RedisServer) -> None:
    r = redis.Redis.from_url(redis_server.url)
    updates = WeightUpdates(stall_after_s=60.0)
    load = {"running": 0, "waiting": 0}

    async def go() -> None:
        client = aredis.Redis.from_url(redis_server.url)
        beat = asyncio.create_task(heartbeat_loop(
            client, KEYS, INFO, interval_s=0.05, admin_key=KEY, version=lambda: 7,
            load=lambda: Load(**load), weight_sync=updates.sync_state))
        try:
            await until(lambda: r.hexists(KEYS.servers, "s1"), "registered")
            first = registered(r)
            assert first.policy_version == 7 and first.weight_sync is None
            assert first.load == Load(running=0, waiting=0)
            load.update(running=3, waiting=5)
            await until(lambda: registered(r).load == Load(running=3, waiting=5), "new load")

            release = asyncio.Event()
            receiving = asyncio.create_task(updates.track(8, 30.0, release.wait()))
            await until(lambda: sync_state(r) == "receiving", "an update under way")
            sync = registered(r).weight_sync
            assert sync is not None and sync.version == 8 and sync.duration_s is None
            release.set()
            await receiving
            await until(lambda: sync_state(r) == "loaded", "loaded")
            loaded = registered(r).weight_sync
            assert loaded is not None and loaded.version == 8
            assert loaded.started_at == sync.started_at and not loaded.error
            assert loaded.duration_s is not None and loaded.duration_s >= 0

            async def fails() -> None:
                raise RuntimeError("the learner went away")

            with pytest.raises(RuntimeError):
                await updates.track(9, 30.0, fails())
            await until(lambda: sync_state(r) == "failed", "failed")
            failed = registered(r).weight_sync
            assert failed is not None and failed.version == 9
            assert failed.error == "RuntimeError: the learner went away"
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
            await client.aclose()

    asyncio.run(go())
    assert not r.hexists(KEYS.servers, "s1")  # deregistered on the way out
    r.close()


def test_a_figure_that_cannot_be_read_does_not_stop_the_beat(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    r = redis.Redis.from_url(redis_server.url)
    broken = {"now": False}

    def load() -> Load:
        if broken["now"]:
            raise RuntimeError("engine stats unavailable")
        return Load(running=2, waiting=1)

    async def go() -> None:
        client = aredis.Redis.from_url(redis_server.url)
        beat = asyncio.create_task(heartbeat_loop(client, KEYS, INFO, interval_s=0.05,
                                                  ttl_s=0.5, admin_key=KEY, load=load))
        try:
            await until(lambda: r.hexists(KEYS.servers, "s1"), "registered")
            broken["now"] = True
            await until(lambda: "engine stats unavailable" in caplog.text, "the warning")
            r.delete(KEYS.server_alive("s1"))
            await until(lambda: r.exists(KEYS.server_alive("s1")), "beating on")
            assert not beat.done()
            assert registered(r).load == Load(running=2, waiting=1)  # its last value
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
            await client.aclose()

    asyncio.run(go())
    r.close()


def test_a_registration_without_the_figures_parses_without_them() -> None:
    """An older server's registration (no ``load``, no ``weight_sync``)."""
    old = {k: v for k, v in INFO.model_dump().items() if k not in ("load", "weight_sync")}
    info = parse_registration(json.dumps({"info": json.dumps(old), "sig": ""}), None)
    assert info.load is None and info.weight_sync is None and info.server_id == "s1"
