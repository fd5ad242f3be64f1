"""One read of the in-flight facts (``gspo_rl.contract.queue.inflight.ADMISSION_FACTS``) against a
real Redis, through the store's connection and through redis-py: every stage counted as the
admission rule defines it, this server's own pending count left to the gate, expired servers
removed."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from gspo_rl.contract.queue.connection import pipe_for
from gspo_rl.contract.queue.inflight import InFlightCounter, Snapshot
from gspo_rl.contract.queue.schema import LEARNER_CONSUMER_GROUP, Keys
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.runtime.published import publish_state, state_fields
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
    for server, pending in (("me", 9), ("other", 4)):
        r.set(KEYS.admission_pending(server), pending, ex=60)
        r.sadd(KEYS.admission_servers, server)
    r.sadd(KEYS.admission_servers, "gone")  # its pending key expired

    snap = asyncio.run(_read(url, through_pipe))
    assert (snap.open, snap.complete, snap.undelivered, snap.ready_depth) == (2, 1, 3, 5)
    assert snap.idle == 1 and "1 open but idle" in snap.describe()
    assert snap.remote_pending == 4  # "me" is the gate's own (local), "gone" counts nothing
    assert (snap.learner.version, snap.learner.training, snap.learner.max_staleness,
            snap.learner.groups_per_step) == (7, 2, 2, 4)
    assert snap.others == 2 + 1 + 3 + 2 + 4
    assert r.smembers(KEYS.admission_servers) == {b"me", b"other"}
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
