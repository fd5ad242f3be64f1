"""Open groups that count as in flight, and groups given up (issue 35): an open group counts
while it has activity (created, rollouts recorded, a reward stored) within ``group_idle_s``,
then stops counting although it stays open until its deadline; an abandoned group leaves at
once, published with its rewards when it has enough of them. Real Redis."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from gspo_rl.redisq.groups.store import QueueConfig, RewardItem, RolloutStore
from gspo_rl.redisq.inflight import InFlightCounter, Snapshot
from tests.helpers.queue import make_rollout, open_group
from tests.redisq.test_groups_store import KEYS, run, stream

IDLE_S = 0.6


async def facts(store: RolloutStore) -> Snapshot:
    return await InFlightCounter(store.redis, KEYS, "reader").read()


async def wait_idle(store: RolloutStore, n: int) -> Snapshot:
    deadline = time.monotonic() + 30
    while (snap := await facts(store)).idle < n:
        assert time.monotonic() < deadline, snap
        await asyncio.sleep(0.05)
    return snap


def test_an_open_group_stops_counting_once_idle_and_counts_again_on_activity(
        redis_url: str) -> None:
    async def body(store: RolloutStore) -> None:
        ids = await open_group(store, "g", 4)  # created + 4 rollouts recorded: activity
        assert (await facts(store)).open == 1
        snap = await wait_idle(store, 1)
        assert (snap.open, snap.idle) == (0, 1)
        assert await store.redis.zscore(KEYS.deadlines, "g") is not None  # still open
        await store.post_rewards([RewardItem(ids[0], 1.0)])  # activity: counts again
        snap = await facts(store)
        assert (snap.open, snap.idle) == (1, 0)
        await wait_idle(store, 1)
        await store.record_rollout(make_rollout(ids[1], "g", n_tokens=20))  # a turn grew
        assert (await facts(store)).open == 1
        done = await store.post_rewards([RewardItem(r, float(i)) for i, r in enumerate(ids)
                                         if i > 0])
        assert done.applied
        snap = await facts(store)  # complete and published: no longer open, nor listed
        assert (snap.open, snap.idle) == (0, 0)
        assert await store.redis.zcard(KEYS.group_activity) == 0

    run(redis_url, body, QueueConfig(group_idle_s=IDLE_S))


def test_expiry_takes_a_group_off_both_lists(redis_url: str) -> None:
    async def body(store: RolloutStore) -> None:
        await open_group(store, "g", 2)
        assert await store.redis.zcard(KEYS.group_activity) == 1
        await asyncio.sleep(0.5)
        await store.sweep_once()
        assert (await store.get_group("g")).state == "expired"  # type: ignore[union-attr]
        assert await store.redis.zcard(KEYS.group_activity) == 0
        assert await store.redis.zcard(KEYS.deadlines) == 0

    run(redis_url, body, QueueConfig(group_ttl_s=0.3))


def test_an_abandoned_group_leaves_at_once(redis_url: str) -> None:
    async def body(store: RolloutStore) -> None:
        await open_group(store, "empty", 4)
        ids = await open_group(store, "half", 4)
        await store.post_rewards([RewardItem(ids[0], 1.0), RewardItem(ids[1], 0.0)])
        assert (await facts(store)).open == 2
        assert await store.abandon_group("empty") == "expired"
        view = await store.get_group("empty")
        assert view is not None and view.drop_reason == "abandoned"
        # two rewards (min_rewarded_to_finalise): published with them, partial
        assert await store.abandon_group("half") == "published"
        view = await store.get_group("half")
        assert view is not None and view.partial and view.n_rewarded == 2
        assert len(await stream(store)) == 1  # "half"
        snap = await facts(store)
        assert (snap.open, snap.idle, snap.complete) == (0, 0, 0)
        counters = await store.counters()
        assert counters["groups_abandoned_dropped"] == counters["groups_abandoned_finalised"] == 1
        # again: nothing changes, the state is told; an unknown group is None
        assert await store.abandon_group("empty") == "expired"
        assert await store.abandon_group("half") == "published"
        assert await store.abandon_group("never") is None
        assert (await store.counters())["groups_abandoned_dropped"] == 1
        # a reward arriving after is refused as for an expired group
        late = await store.post_rewards([RewardItem(ids[2], 1.0)])
        assert not late.applied and late.results[0].status == "closed"

    run(redis_url, body)


def test_activity_scores_are_written_by_the_recording_server(redis_url: str) -> None:
    """The score is the end of the group's counting (activity + the writer's
    ``group_idle_s``): readers need no setting of their own."""
    async def body(store: RolloutStore) -> None:
        before = time.time()
        await open_group(store, "g", 2)
        score = await store.redis.zscore(KEYS.group_activity, "g")
        assert score is not None and before + 50 <= score <= time.time() + 50 + 1

    run(redis_url, body, QueueConfig(group_idle_s=50))


def test_a_group_recorded_whole_counts_from_its_creation(redis_url: str) -> None:
    async def body(store: RolloutStore) -> None:
        recs = [make_rollout(f"w:{i}", "w") for i in range(2)]
        await store.record_group("w", 2, None, recs)
        assert (await facts(store)).open == 1
        client: aioredis.Redis = store.redis
        assert await client.zscore(KEYS.group_activity, "w") is not None

    run(redis_url, body)
