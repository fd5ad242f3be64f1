"""What one admission read costs Redis as the fleet grows: ``IN_FLIGHT_FACTS``, the script a
server's admission gate runs before it starts a group (it walked every server's pending key,
so its cost grew with the number of servers; it reads their kept sum now).

Contract: ``measure_admission(url, servers)`` flushes the database and, for each count ``S``,
registers ``S`` servers' pending counts (as ``InFlightCounter.publish`` does) and runs
``InFlightCounter.read`` (the real script, through a store's connection) enough times to
measure; returns Redis main-thread CPU microseconds per read for each ``S`` and the line
``us = a + b * S`` through them (``fit``: least squares of the relative residuals).
"""

from __future__ import annotations

import asyncio

import numpy as np

from benchmarks.lib.fleet_redis import RedisCpu


async def _cpu(client: object) -> RedisCpu:
    i = await client.info("cpu")  # type: ignore[attr-defined]
    return RedisCpu(main=i["used_cpu_sys_main_thread"] + i["used_cpu_user_main_thread"],
                    total=i["used_cpu_sys"] + i["used_cpu_user"],
                    children=i["used_cpu_sys_children"] + i["used_cpu_user_children"])


async def _per_read(url: str, servers: int, reads: int) -> float:
    from gspo_rl.contract.schema import Keys
    from gspo_rl.redisq.client import make_redis
    from gspo_rl.redisq.groups.store import RolloutStore
    from gspo_rl.redisq.inflight import InFlightCounter

    client = make_redis(url)
    store, keys = RolloutStore(client), Keys()
    await client.flushall()
    for s in range(servers):  # each server's count, as its gate publishes it
        await InFlightCounter(client, keys, f"sim{s}").publish(1)
    counter = InFlightCounter(client, keys, "probe", pipe=store.pipe)
    await counter.read()  # the script loaded
    c0 = await _cpu(client)
    for _ in range(reads):
        await counter.read()
    c1 = await _cpu(client)
    await client.flushall()
    await store.aclose()
    await client.aclose()
    return 1e6 * (c1.main - c0.main) / reads


def measure_admission(url: str, servers: list[int]) -> dict[str, object]:
    """Microseconds of Redis CPU per admission read at each server count, and the fit."""
    us = [asyncio.run(_per_read(url, s, max(50, min(2000, 200_000 // max(1, s)))))
          for s in servers]
    # relative residuals: the small counts matter as much as the large ones
    b, a = (np.polyfit(servers, us, 1, w=[1 / max(u, 1e-9) for u in us])
            if len(servers) > 1 else (0.0, us[0]))
    return {"servers": servers, "us": us, "fit": (float(a), float(b))}
