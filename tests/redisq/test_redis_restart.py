"""Redis restarts mid-run (AOF on): no reward that got a 2xx is lost, every group is published
once, the learner's pending groups survive, and the server stays up through the outage."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import redis

from gspo_rl.contract.schema import Keys
from gspo_rl.redisq.groups.store import QueueConfig
from gspo_rl.redisq.ready.reader import GroupReader
from tests.conftest import RedisServer, free_port, wait_for_port
from tests.helpers.queue import ApiServer, open_group, publish_groups, ready_groups

KEYS = Keys()
REPO = Path(__file__).resolve().parents[2]


async def post_until_stored(client: httpx.AsyncClient, rid: str, reward: float,
                            log: list[tuple[str, int]], timeout: float = 60.0) -> None:
    """What an environment does: retry on 503 / connection errors until a 200 (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            resp = await client.post("/v1/rewards", json={"rollout_id": rid, "reward": reward})
        except httpx.TransportError:
            await asyncio.sleep(0.05)
            continue
        log.append((rid, resp.status_code))
        if resp.status_code == 200:
            return
        assert resp.status_code == 503, resp.text  # only "unavailable, retry" is acceptable
        await asyncio.sleep(0.05)
    raise TimeoutError(f"reward for {rid} not stored within {timeout}s")


def test_rewards_survive_a_redis_restart(redis_aof_server: RedisServer) -> None:
    config = QueueConfig(stuck_complete_s=0.2)
    api = ApiServer(redis_aof_server.url, config=config, sweeper_interval_s=0.1)
    try:
        ids = {f"g{i}": api.run(open_group(api.store, f"g{i}", 4)) for i in range(20)}
        rewards = {rid: float(j) for g in ids.values() for j, rid in enumerate(g)}
        log: list[tuple[str, int]] = []

        async def drive() -> None:
            async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
                order = list(rewards)
                await asyncio.gather(*[post_until_stored(client, x, rewards[x], log)
                                       for x in order[:40]])
                assert [s for _, s in log] == [200] * 40
                # Graceful stop (SIGTERM: Redis fsyncs the AOF), then post the rest: they get
                # 503 while Redis is down (the environment retries), 200 once it is back.
                await asyncio.to_thread(redis_aof_server.stop)
                rest = asyncio.gather(*[post_until_stored(client, x, rewards[x], log)
                                        for x in order[40:]])
                deadline = time.monotonic() + 30
                while 503 not in [s for _, s in log] and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                await asyncio.to_thread(redis_aof_server.start)
                await rest

        asyncio.run(drive())
        assert 503 in [s for _, s in log]  # the outage was seen, and answered 503, not 2xx
        ok = {rid for rid, status in log if status == 200}
        assert ok == set(rewards)
        r = redis.Redis.from_url(redis_aof_server.url)
        deadline = time.monotonic() + 30  # groups whose publication hit the outage: sweeper
        while r.xlen(KEYS.ready_stream) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        published = ready_groups(r, KEYS)
        assert sorted(g.group_id for g in published) == sorted(ids)  # each exactly once
        for g in published:
            assert g.rewards == [rewards[x.rollout_id] for x in g.rollouts]
        # Every acknowledged reward is in Redis after the restart, counted once.
        assert int(r.hget(KEYS.counters, "rewards_stored")) == 80
        r.close()
    finally:
        api.close()


def test_pending_groups_survive_a_redis_restart(redis_aof_server: RedisServer) -> None:
    stream_ids = asyncio.run(publish_groups(redis_aof_server.url, ["a", "b", "c"]))
    r = redis.Redis.from_url(redis_aof_server.url)
    reader = GroupReader(r)
    assert reader.read_batch(2, 0, 5).entry_ids == stream_ids[:2]  # trained, not acked
    redis_aof_server.restart()  # the learner dies too
    r2 = redis.Redis.from_url(redis_aof_server.url)
    resumed = GroupReader(r2)
    batch = resumed.read_batch(3, 0, 5)
    assert batch.entry_ids == stream_ids and batch.reclaimed == 2
    r.close()
    r2.close()


def test_shipped_redis_conf_enables_aof_and_noeviction(tmp_path: Path) -> None:
    exe = shutil.which("redis-server")
    assert exe is not None
    port = free_port()
    proc = subprocess.Popen(
        [exe, str(REPO / "docker" / "redis.conf"), "--port", str(port), "--bind", "127.0.0.1",
         "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, proc)
        r = redis.Redis(port=port, decode_responses=True)
        assert r.config_get("appendonly") == {"appendonly": "yes"}
        assert r.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        r.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
