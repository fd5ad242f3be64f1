"""What one Redis spends on the simulated fleet: its CPU (``INFO cpu``) and the memory a
sample holds in each state of its life (``INFO memory`` deltas).

Contract: ``redis_cpu`` reads the server's CPU seconds (main thread: the one core that
saturates; all threads; forked children: AOF rewrites). ``measure_memory`` runs, on a flushed
Redis, ``n_groups`` groups of ``shape`` through the real store and reader, one state at a time,
and returns bytes per sample recorded and waiting for rewards (open), published and unread;
what a dropped group still holds after its drop, split into its records and its tombstone
(state, rewards, ids: found by deleting the records), with each one's TTL; the same for a
trained group after the reader's ack (records per sample, tombstone per group); the records
as raw stream entries (``pack_ready_group`` bytes, XADD: the baseline); the packed record
size. Connections are closed before each reading, so client buffers are not counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from benchmarks.lib.fleet_emit import GroupMaker, Shape, random_pool, rewards


@dataclass(frozen=True)
class RedisCpu:
    main: float
    total: float
    children: float

    def __sub__(self, other: RedisCpu) -> RedisCpu:
        return RedisCpu(self.main - other.main, self.total - other.total,
                        self.children - other.children)


def redis_cpu(client: redis.Redis) -> RedisCpu:
    """CPU seconds used so far by the server (``getrusage``: microsecond resolution)."""
    i = client.info("cpu")
    return RedisCpu(main=i["used_cpu_sys_main_thread"] + i["used_cpu_user_main_thread"],
                    total=i["used_cpu_sys"] + i["used_cpu_user"],
                    children=i["used_cpu_sys_children"] + i["used_cpu_user_children"])


def used_memory(client: redis.Redis) -> int:
    time.sleep(0.05)  # let the server finish what the closed connections left
    return int(client.info("memory")["used_memory"])


async def _with_store(url: str, fn: Callable[[Any], Awaitable[None]]) -> None:
    from gspo_rl.redisq.client import make_redis
    from gspo_rl.redisq.groups.store import RolloutStore

    client = make_redis(url)
    store = RolloutStore(client)
    try:
        await fn(store)
    finally:
        await store.aclose()
        await client.aclose()


def _record(url: str, groups: list[tuple[str, list[Any]]], size: int) -> None:
    async def go(store: Any) -> None:
        for gid, recs in groups:
            await store.record_group(gid, size, {"task_id": "mem"}, recs)
    asyncio.run(_with_store(url, go))


def _reward(url: str, groups: list[tuple[str, list[Any]]], drop: bool, seed: int) -> None:
    from gspo_rl.redisq.groups.store import RewardItem

    rng = np.random.default_rng(seed)

    async def go(store: Any) -> None:
        for _, recs in groups:
            rs = rewards(rng, len(recs), drop)
            await store.post_rewards([RewardItem(r.rollout_id, x)
                                      for r, x in zip(recs, rs, strict=True)])
    asyncio.run(_with_store(url, go))


def _read_all(url: str, n_groups: int) -> None:
    from gspo_rl.redisq.ready.reader import GroupReader

    client = redis.Redis.from_url(url)
    reader, got, tries = GroupReader(client), 0, 0
    while got < n_groups and tries < 100:
        b = reader.read_batch(min(16, n_groups - got), current_version=0, timeout_s=1.0)
        reader.ack(b.entry_ids)
        got, tries = got + len(b.groups), tries + 1
    client.close()
    if got < n_groups:
        raise RuntimeError(f"memory phase: read {got} of {n_groups} groups")


def _raw_stream(client: redis.Redis, groups: list[tuple[str, list[Any]]]) -> None:
    from gspo_rl.contract.schema import READY_STREAM_FIELD, ReadyGroup, pack_ready_group

    for gid, recs in groups:
        n = len(recs)
        payload = pack_ready_group(ReadyGroup(gid, recs, [0.0] * n, [0.0] * n, [None] * n,
                                              {"task_id": "mem"}, time.time()))
        client.xadd("sim:raw", {READY_STREAM_FIELD: payload})


def _ttl(client: redis.Redis, key: str) -> float:
    """Seconds left (-1: none; -2: the key is gone)."""
    ms = client.pttl(key)
    return ms / 1000 if ms >= 0 else float(ms)


def _drop_records(client: redis.Redis, groups: list[tuple[str, list[Any]]]) -> int:
    """Deletes the groups' records keys (what is left is their tombstone); used memory after."""
    from gspo_rl.contract.schema import Keys

    client.delete(*[Keys().group_records(g) for g, _ in groups])
    return used_memory(client)


def measure_memory(url: str, shape: Shape, n_groups: int, seed: int = 7) -> dict[str, float]:
    """Bytes per sample in each state (module docstring); flushes the database first."""
    from gspo_rl.contract.schema import Keys
    from gspo_rl.redisq.ready.entry import pack_group_records

    client, keys = redis.Redis.from_url(url), Keys()
    client.flushall()
    maker = GroupMaker(shape, seed, random_pool(2 * shape.max_tokens + 1, seed))
    pub, drop = ([(g, maker.records(g, maker.lengths(), {"server_id": "mem"}))
                  for g in (f"mem-{tag}{k}" for k in range(n_groups))] for tag in "pd")
    n = n_groups * shape.group
    m = {"0": used_memory(client)}
    _record(url, pub, shape.group)
    m["open"] = used_memory(client)
    _reward(url, pub, False, seed)
    m["pub"] = used_memory(client)
    _record(url, drop, shape.group)
    _reward(url, drop, True, seed)
    m["drop"] = used_memory(client)
    _read_all(url, n_groups)
    m["trained"] = used_memory(client)
    ttl = {"dropped_records_ttl_s": _ttl(client, keys.group_records(drop[0][0])),
           "dropped_tomb_ttl_s": _ttl(client, keys.group(drop[0][0])),
           "trained_records_ttl_s": _ttl(client, keys.group_records(pub[0][0])),
           "trained_tomb_ttl_s": _ttl(client, keys.group(pub[0][0]))}
    m["drop_tomb"] = _drop_records(client, drop)
    m["tombs"] = _drop_records(client, pub)
    _raw_stream(client, pub)
    m["raw"] = used_memory(client)
    client.flushall()
    client.close()
    dropped = (m["drop"] - m["pub"]) / n_groups
    dropped_records = (m["trained"] - m["drop_tomb"]) / n_groups
    return {
        "tokens": sum(len(r.token_ids) for _, rs in pub for r in rs) / n,
        "record_bytes": sum(len(pack_group_records(rs)) for _, rs in pub) / n,
        "open": (m["open"] - m["0"]) / n, "unread": (m["pub"] - m["0"]) / n,
        "dropped_group": dropped, "dropped_records": dropped_records,
        "dropped_tomb": dropped - dropped_records,
        "trained_records": (m["drop_tomb"] - m["tombs"]) / n,
        "trained_tomb": (m["tombs"] - m["0"]) / n_groups - (dropped - dropped_records),
        "raw": (m["raw"] - m["tombs"]) / n, **ttl,
    }
