"""One read of the in-flight facts (``gspo_rl.redisq.inflight.IN_FLIGHT_FACTS``)
against a real Redis, through the store's connection and through redis-py: every stage counted
as the admission rule defines it, this server's own pending count left to the gate, the counts
of servers whose time is up removed with their share of the sum."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from gspo_rl.contract.schema import LEARNER_CONSUMER_GROUP, Keys
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.runtime.published import publish_state, state_fields
from gspo_rl.redisq.connection import pipe_for
from gspo_rl.redisq.inflight import InFlightCounter, Snapshot
from gspo_rl.redisq.tasks import GroupOutcome, record_outcomes
from tests.conftest import RedisServer

KEYS = Keys()


async def _read(url: str, through_pipe: bool) -> Snapshot:
    client = aioredis.Redis.from_url(url)
    pipe = pipe_for(client) if through_pipe else None
    try:
        return await InFlightCounter(client, KEYS, "me", pipe).read()
    finally:
        if pipe is not None:
            await pipe.aclose()
        await client.aclose()


@pytest.mark.parametrize("through_pipe", [True, False], ids=["pipe", "redis-py"])
def test_one_read_counts_every_stage(redis_server: RedisServer, tiny_model_dir,
                                     through_pipe: bool) -> None:
    url = redis_server.url
    r = redis.Redis.from_url(url)
    # nothing at all yet: no stream, no learner
    empty = asyncio.run(_read(url, through_pipe))
    assert (empty.others, empty.undelivered, empty.ready_depth) == (0, 0, 0)
    assert not empty.learner.known

    import time

    r.zadd(KEYS.deadlines, {"g1": 1.0, "g2": 2.0, "g4": 3.0})  # open
    # g1, g2 had activity lately; g4's last activity is older than group_idle_s: idle
    r.zadd(KEYS.group_activity, {"g1": time.time() + 60, "g2": time.time() + 60,
                                 "g4": time.time() - 1})
    r.sadd(KEYS.complete, "g3")  # complete
    for i in range(5):
        r.xadd(KEYS.ready_stream, {"g": f"r{i}"})
    # no consumer group yet: the whole stream is undelivered
    assert asyncio.run(_read(url, through_pipe)).undelivered == 5
    r.xgroup_create(KEYS.ready_stream, LEARNER_CONSUMER_GROUP, id="0")
    r.xreadgroup(LEARNER_CONSUMER_GROUP, "l", {KEYS.ready_stream: ">"}, count=2)
    r.xgroup_create(KEYS.ready_stream, "someone-else", id="$")  # not the learner's: ignored
    cfg = LearnerConfig(model=str(tiny_model_dir), redis_url=url, max_staleness=2,
                        groups_per_step=4)
    publish_state(r, KEYS, state_fields(cfg, 7, 7, 0, training=2))
    for server, pending in (("me", 9), ("other", 4), ("gone", 5)):
        asyncio.run(_publish(url, server, pending))
    r.zadd(KEYS.admission_seen, {"gone": 1.0})  # its time is long up: it crashed

    snap = asyncio.run(_read(url, through_pipe))
    assert (snap.open, snap.complete, snap.undelivered, snap.ready_depth) == (2, 1, 3, 5)
    assert snap.idle == 1 and "1 open but idle" in snap.describe()
    assert snap.remote_pending == 4  # "me" is the gate's own (local), "gone" counts nothing
    assert (snap.learner.version, snap.learner.training, snap.learner.max_staleness,
            snap.learner.groups_per_step) == (7, 2, 2, 4)
    assert snap.others == 2 + 1 + 3 + 2 + 4
    assert sorted(r.zrange(KEYS.admission_seen, 0, -1)) == [b"me", b"other"]
    assert int(r.get(KEYS.admission_pending_total)) == 13  # "gone" left the sum
    assert r.hgetall(KEYS.admission_pending) == {b"me": b"9", b"other": b"4"}
    r.close()


async def _publish(url: str, server: str, pending: int) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await InFlightCounter(client, KEYS, server).publish(pending)
    finally:
        await client.aclose()


def test_pending_counts_and_their_sum_move_together(redis_server: RedisServer) -> None:
    """Each server's count replaces its last one and the sum follows; a server that withdraws
    takes its share with it; a count whose time is up leaves at the next read."""
    url, r = redis_server.url, redis.Redis.from_url(redis_server.url)
    for server, pending in (("a", 3), ("b", 2), ("a", 5), ("c", 7)):
        asyncio.run(_publish(url, server, pending))
    assert int(r.get(KEYS.admission_pending_total)) == 5 + 2 + 7

    async def withdraw_b() -> None:
        client = aioredis.Redis.from_url(url)
        await InFlightCounter(client, KEYS, "b").withdraw()
        await client.aclose()

    asyncio.run(withdraw_b())
    assert int(r.get(KEYS.admission_pending_total)) == 12
    r.zadd(KEYS.admission_seen, {"c": 1.0})  # c stopped publishing long ago
    snap = asyncio.run(_read(url, through_pipe=False))  # read as "me": every count is remote
    assert snap.remote_pending == 5 and int(r.get(KEYS.admission_pending_total)) == 5
    assert r.hgetall(KEYS.admission_pending) == {b"a": b"5"}
    r.close()


@pytest.mark.parametrize("through_pipe", [True, False], ids=["pipe", "redis-py"])
def test_a_read_after_redis_forgot_its_scripts(redis_server: RedisServer,
                                               through_pipe: bool) -> None:
    """A restarted Redis has no scripts: the read loads its own again and answers."""
    url = redis_server.url

    async def go() -> tuple[Snapshot, Snapshot]:
        client = aioredis.Redis.from_url(url)
        pipe = pipe_for(client) if through_pipe else None
        counter = InFlightCounter(client, KEYS, "me", pipe)
        try:
            first = await counter.read()
            await client.script_flush()
            await client.zadd(KEYS.deadlines, {"g1": 1.0})
            await client.zadd(KEYS.group_activity, {"g1": 2e9})
            return first, await counter.read()
        finally:
            if pipe is not None:
                await pipe.aclose()
            await client.aclose()

    first, second = asyncio.run(go())
    assert (first.open, second.open) == (0, 1)


async def _read_drought(url: str, hold_s: float, drought_s: float) -> Snapshot:
    client = aioredis.Redis.from_url(url)
    try:
        return await InFlightCounter(client, KEYS, "me", no_signal_hold_s=hold_s,
                                     no_signal_drought_s=drought_s).read()
    finally:
        await client.aclose()


def test_a_drought_counts_every_held_group_and_one_group_with_a_signal_ends_it(
        redis_server: RedisServer, tiny_model_dir) -> None:
    """The sampling budget's drought (``no_signal_drought_s``): no group with a signal for
    that long while groups kept ending without one. Outside it the budget leaves one step's
    groups free; in it every held group counts; a group with a signal (recorded by
    ``record_outcomes``) ends it at once."""
    import time

    url, r = redis_server.url, redis.Redis.from_url(redis_server.url)
    cfg = LearnerConfig(model=str(tiny_model_dir), redis_url=url, max_staleness=1,
                        groups_per_step=2)
    now = time.time()
    publish_state(r, KEYS, {**state_fields(cfg, 0, 0, 0), "updated_at": now - 100})  # bound 4
    r.zadd(KEYS.no_signal, {"new1": now - 1, "new2": now - 0.5, "new3": now - 0.2})
    snap = asyncio.run(_read_drought(url, hold_s=30, drought_s=5))
    assert (snap.no_signal, snap.drought, snap.in_drought) == (3, 0, False)  # only 1 s dry
    assert snap.budget_counted(4) == 2  # 4 - 2 places held: one step's groups free
    r.zadd(KEYS.no_signal, {"old": now - 8})  # groups kept ending without one for 8 s
    snap = asyncio.run(_read_drought(url, hold_s=30, drought_s=5))
    assert (snap.no_signal, snap.drought, snap.in_drought) == (4, 3, True)
    assert snap.budget_counted(4) == 4  # every held group counts
    assert asyncio.run(_read_drought(url, hold_s=30, drought_s=0)).drought == 0  # off
    assert asyncio.run(_read_drought(url, hold_s=30, drought_s=20)).drought == 0  # 8 s < 20

    async def one_group_with_a_signal(at: float) -> None:
        client = aioredis.Redis.from_url(url)
        try:
            await record_outcomes(client, KEYS, [
                GroupOutcome("sig", "published", "", None, [0.0, 1.0])], at)
        finally:
            await client.aclose()

    asyncio.run(one_group_with_a_signal(time.time()))
    snap = asyncio.run(_read_drought(url, hold_s=30, drought_s=5))
    assert (snap.drought, snap.budget_counted(4)) == (0, 2)
    asyncio.run(one_group_with_a_signal(now - 60))  # an older time never moves it back
    assert asyncio.run(_read_drought(url, hold_s=30, drought_s=5)).drought == 0
    r.close()
