"""The queue's round-trip design against a real Redis: a group opened and recorded in one call
(its records one value, one key), published by reference (a small stream entry; the records stay
where they were written, never copied), read and expired (or deleted) with their entry by the
learner's reader, never overwritten while they wait for it, a partial group's subset picked
from its records, and the auto-pipelined connection surviving a killed connection."""

from __future__ import annotations

import asyncio

import pytest
import redis

from gspo_rl.contract.schema import (
    READY_COUNT_FIELD,
    READY_HEAD_FIELD,
    READY_RECORDS_FIELD,
    Keys,
    member_rollout_id,
    pack_ready_group,
    unpack_ready_group,
)
from gspo_rl.redisq.client import make_redis
from gspo_rl.redisq.groups.store import (
    QueueConfig,
    RewardItem,
    RolloutStore,
    StoreError,
)
from gspo_rl.redisq.ready.entry import pack_group_records
from gspo_rl.redisq.ready.reader import KEEP_TRAINED_S, GroupReader
from tests.helpers.queue import make_rollout, publish_groups, ready_records, stored_rollout

KEYS = Keys()


def with_store(url: str, fn, config: QueueConfig | None = None) -> object:  # type: ignore[no-untyped-def]
    async def main() -> object:
        client = make_redis(url)
        store = RolloutStore(client, KEYS, config or QueueConfig())
        try:
            return await asyncio.wait_for(fn(store), 60)
        finally:
            await store.aclose()
            await client.aclose()

    return asyncio.run(main())


def test_record_group_opens_and_records_in_one_call(redis_url: str, r: redis.Redis) -> None:
    recs = [make_rollout(f"g-r{i}", "g", 20, seed=i) for i in range(3)]

    async def body(store: RolloutStore) -> None:
        await store.record_group("g", 3, {"p": 1}, recs)
        await store.record_group("g", 3, {"p": 1}, recs)  # a retried request: idempotent
        with pytest.raises(StoreError) as e:  # same id, another size: nothing recorded
            await store.record_group("g", 4, None, [make_rollout("x", "g")])
        assert e.value.code == "group_exists"
        view = await store.get_group("g")
        assert view is not None and view.state == "open" and view.size == 3
        assert view.rollout_ids == ["g-r0", "g-r1", "g-r2"] and view.metadata == {"p": 1}
        assert (await store.counters())["groups_created"] == 1

    with_store(redis_url, body)
    assert r.get(KEYS.rollout("x")) is None and r.get(KEYS.rollout_staging("x")) is None
    assert r.get(KEYS.group_records("g")) == pack_group_records(recs)  # one value, in order
    assert r.hget(KEYS.group("g"), "records") == b"3"
    assert r.exists(*[KEYS.rollout(x.rollout_id) for x in recs]) == 0  # none of its own


def test_record_group_writes_one_value_and_refuses_a_group_in_use(
        redis_url: str, r: redis.Redis) -> None:
    recs = [make_rollout(f"g-r{i}", "g", 20, seed=i) for i in range(2)]
    other = [make_rollout(f"o-r{i}", "g", 20, seed=10 + i) for i in range(2)]

    async def body(store: RolloutStore) -> None:
        await store.record_group("g", 2, None, recs)
        # the same group id, the same size, other rollouts: not a retry of that call
        with pytest.raises(StoreError) as e:
            await store.record_group("g", 2, None, other)
        assert e.value.code == "group_exists"
        with pytest.raises(StoreError) as e:  # more rollouts than the group holds
            await store.record_group("h", 1, None, [make_rollout(f"h-r{i}", "h")
                                                    for i in range(2)])
        assert e.value.code == "group_full"
        view = await store.get_group("g")
        assert view is not None and view.rollout_ids == ["g-r0", "g-r1"]
        assert await store.get_group("h") is None

    with_store(redis_url, body)
    # no staging key was used; the group's records are its first call's (NX), nothing of the
    # refused calls was left behind
    assert not r.keys(KEYS.rollout_staging("*")) and not r.keys(KEYS.rollout("*-r?"))
    assert r.get(KEYS.group_records("g")) == pack_group_records(recs)
    assert r.exists(KEYS.group_records("h")) == 0
    assert [r.get(KEYS.rollout_group(x.rollout_id)) for x in recs] == [b"g", b"g"]
    assert r.ttl(KEYS.group_records("g")) > 0 and r.ttl(KEYS.rollout_group("g-r0")) > 0


def test_a_group_in_use_without_records_keeps_nothing_of_a_refused_call(
        redis_url: str, r: redis.Redis) -> None:
    async def body(store: RolloutStore) -> None:
        await store.create_group("e", 2)  # opened by POST /v1/groups: rollouts one by one
        with pytest.raises(StoreError) as e:
            await store.record_group("e", 2, None, [make_rollout(f"e-r{i}", "e")
                                                    for i in range(2)])
        assert e.value.code == "group_exists"
        await store.record_rollout(make_rollout("e-x", "e"))  # its own way still works
        await store.record_group("s", 2, None, [make_rollout(f"s-r{i}", "s") for i in range(2)])
        with pytest.raises(StoreError) as e:  # a group recorded whole takes none on its own
            await store.record_rollout(make_rollout("s-r0", "s"))
        assert e.value.code == "group_sealed"

    with_store(redis_url, body)
    assert r.exists(KEYS.group_records("e")) == 0 and r.exists(KEYS.rollout("e-x")) == 1
    assert r.exists(KEYS.rollout("s-r0"), KEYS.rollout_staging("s-r0")) == 0


def test_published_by_reference_and_expired_with_the_entry(redis_url: str,
                                                            r: redis.Redis) -> None:
    recs = [make_rollout(f"g-r{i}", "g", 1024, seed=i) for i in range(4)]

    async def body(store: RolloutStore) -> None:
        await store.record_group("g", 4, None, recs)
        out = await store.post_rewards([RewardItem(x.rollout_id, float(i))
                                        for i, x in enumerate(recs)])
        assert out.applied and out.results[-1].group_complete

    with_store(redis_url, body)
    ((entry_id, fields),) = [(i.decode(), f) for i, f in r.xrange(KEYS.ready_stream)]
    assert set(fields) == {READY_HEAD_FIELD.encode(), READY_COUNT_FIELD.encode(),
                           READY_RECORDS_FIELD.encode()}
    assert fields[READY_RECORDS_FIELD.encode()] == b"g"
    assert len(fields[READY_HEAD_FIELD.encode()]) < 1024  # the group's head, not its bytes
    ready = [KEYS.group_records("g")]
    assert r.get(ready[0]) == pack_group_records(recs)  # the records, as written
    assert r.ttl(ready[0]) == -1  # the entry's now: no TTL
    r.delete(*[KEYS.rollout_group(x.rollout_id) for x in recs])  # as when the mappings expire

    async def reuse(store: RolloutStore) -> None:  # a waiting record is never replaced
        await store.create_group("h", 1)
        await store.record_rollout(make_rollout(recs[0].rollout_id, "h", 8))

    with_store(redis_url, reuse)
    assert r.get(ready[0]) == pack_group_records(recs)

    other = GroupReader(r, group="eval")  # a second consumer group, still to read it
    reader = GroupReader(r)
    batch = reader.read_batch(1, 0, 5)
    (group,) = batch.groups
    assert [x.rollout_id for x in group.rollouts] == [x.rollout_id for x in recs]
    assert unpack_ready_group(pack_ready_group(group)).rewards == [0.0, 1.0, 2.0, 3.0]
    reader.ack(batch.entry_ids)
    assert r.exists(*ready) == 1  # "eval" still needs the entry: its records stay
    assert [g.group_id for g in other.read_batch(1, 0, 5).groups] == ["g"]
    other.ack([entry_id])
    assert r.xlen(KEYS.ready_stream) == 0  # trimmed; its records stay readable a while
    assert r.get(ready[0]) == pack_group_records(recs)
    assert 0 < r.ttl(ready[0]) <= KEEP_TRAINED_S

    recs2 = [make_rollout(f"h-r{i}", "h2", 64, seed=i) for i in range(2)]

    async def second(store: RolloutStore) -> None:
        await store.record_group("h2", 2, None, recs2)
        await store.post_rewards([RewardItem(x.rollout_id, float(i))
                                  for i, x in enumerate(recs2)])

    with_store(redis_url, second)
    reader.keep_trained_s = other.keep_trained_s = 0  # no retention: deleted with the entry
    reader.ack(reader.read_batch(1, 0, 5).entry_ids)
    other.ack(other.read_batch(1, 0, 5).entry_ids)
    assert r.xlen(KEYS.ready_stream) == 0
    assert r.exists(KEYS.group_records("h2")) == 0


def test_an_entry_whose_records_are_gone_is_acked_as_unreadable(redis_url: str,
                                                                 r: redis.Redis) -> None:
    lost, fine = asyncio.run(publish_groups(redis_url, ["lost", "fine"]))
    r.delete(KEYS.rollout("lost-r1"))  # as if Redis lost it
    reader = GroupReader(r)
    batch = reader.read_batch(2, 0, 5)
    assert batch.entry_ids == [fine] and batch.dropped_malformed == [lost]
    assert reader.pending_ids() == [fine]

    async def whole(store: RolloutStore) -> None:  # the same with a group's one records key
        for gid in ("lost2", "fine2"):
            recs = [make_rollout(f"{gid}-r{i}", gid) for i in range(2)]
            await store.record_group(gid, 2, None, recs)
            await store.post_rewards([RewardItem(x.rollout_id, float(i))
                                      for i, x in enumerate(recs)])

    with_store(redis_url, whole)
    r.delete(KEYS.group_records("lost2"))
    batch = reader.read_batch(2, 0, 5)
    assert [g.group_id for g in batch.groups] == ["fine2"]
    assert len(batch.dropped_malformed) == 1


def test_a_partial_group_publishes_its_rewarded_records_from_the_group_key(
        redis_url: str, r: redis.Redis) -> None:
    """A group finalised at its deadline with some of its rollouts rewarded publishes those,
    picked from the group's records in its order; the reader and the trajectory bytes agree."""
    recs = [make_rollout(f"p-r{i}", "p", 24, seed=i) for i in range(4)]

    async def body(store: RolloutStore) -> None:
        await store.record_group("p", 4, None, recs)
        out = await store.post_rewards([RewardItem("p-r3", 1.0), RewardItem("p-r1", 0.0)])
        assert out.applied
        await asyncio.sleep(0.6)
        assert (await store.sweep_once())["expired_finalised"] == 1

    with_store(redis_url, body, QueueConfig(group_ttl_s=0.5, min_rewarded_to_finalise=2))
    (group,) = GroupReader(r).read_batch(1, 0, 5).groups
    assert [x.rollout_id for x in group.rollouts] == ["p-r1", "p-r3"]
    assert group.rewards == [0.0, 1.0]
    assert [x.token_ids.tolist() for x in group.rollouts] == [
        recs[1].token_ids.tolist(), recs[3].token_ids.tolist()]
    (data,) = [d for _, d in ready_records(r)]
    assert unpack_ready_group(data).rollouts[1].logprobs.tolist() == recs[3].logprobs.tolist()


def test_the_pipelined_connection_recovers_from_a_killed_connection(redis_url: str,
                                                                     r: redis.Redis) -> None:
    async def body(store: RolloutStore) -> None:
        await store.record_group("a", 2, None, [make_rollout(f"a{i}", "a") for i in range(2)])
        r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        await store.record_group("b", 2, None, [make_rollout(f"b{i}", "b") for i in range(2)])
        results = await asyncio.gather(*[store.post_rewards([RewardItem(x, float(i))])
                                         for i, x in enumerate(["a0", "a1", "b0", "b1"])])
        assert all(o.applied for o in results)

    with_store(redis_url, body)
    assert int(r.hget(KEYS.counters, "groups_published")) == 2


def test_ids_that_name_their_group_need_no_mapping_keys(redis_url: str, r: redis.Redis) -> None:
    """The sampling path's ids (``member_rollout_id``): no rollout -> group key is written;
    rewards find the group from the id; ids of that form that are not the group's are unknown
    and change nothing."""
    recs = [make_rollout(member_rollout_id("m", i), "m", 24, seed=i) for i in range(3)]
    flat = [make_rollout(member_rollout_id("f", i), "f", 24, seed=i) for i in range(2)]

    async def body(store: RolloutStore) -> None:
        await store.record_group("m", 3, None, recs)
        await store.create_group("f", 2)  # ids of that form, recorded one by one: mapped
        await store.record_rollouts(flat)
        assert r.hget(KEYS.group("m"), "members") == b"1"
        assert r.exists(*[KEYS.rollout_group(x.rollout_id) for x in recs]) == 0
        for bogus in ("m:3", "m:01", "m:-1", "nope:0", "m:"):
            out = await store.post_rewards([RewardItem("m:0", 1.0), RewardItem(bogus, 1.0)])
            assert not out.applied
            assert [x.status for x in out.results] == ["not_applied", "unknown_rollout"]
        assert r.exists(KEYS.group_rewards("m")) == 0  # nothing was stored
        out = await store.post_rewards([RewardItem("f:0", 1.0)])  # through its mapping
        assert out.applied and out.results[0].group_id == "f"
        out = await store.post_rewards([RewardItem(x.rollout_id, float(i))
                                        for i, x in enumerate(recs)])
        assert out.applied and out.results[-1].group_complete
        assert {x.group_id for x in out.results} == {"m"}
        again = await store.post_rewards([RewardItem("m:1", 1.0)])  # a retried post
        assert again.applied and again.results[0].status == "duplicate"
        late = await store.post_rewards([RewardItem("m:1", 5.0)])
        assert late.results[0].status == "conflict"

    with_store(redis_url, body)
    assert not r.keys(KEYS.rollout_group("m:*"))
    assert 0 < r.ttl(KEYS.group("m")) <= QueueConfig().finished_ttl_s  # shortened when it ended
    (group,) = GroupReader(r).read_batch(1, 0, 5).groups
    assert [x.rollout_id for x in group.rollouts] == ["m:0", "m:1", "m:2"]
    assert stored_rollout(r, "f:1") is not None and stored_rollout(r, "m:2") is not None


def test_an_expired_group_of_members_is_finalised_from_its_records(
        redis_url: str, r: redis.Redis) -> None:
    recs = [make_rollout(member_rollout_id("x", i), "x", 24, seed=i) for i in range(3)]
    lone = [make_rollout(member_rollout_id("y", i), "y", 24, seed=i) for i in range(2)]

    async def body(store: RolloutStore) -> None:
        await store.record_group("x", 3, None, recs)
        await store.record_group("y", 2, None, lone)
        await store.post_rewards([RewardItem("x:0", 0.0), RewardItem("x:2", 1.0)])
        await asyncio.sleep(0.6)
        assert (await store.sweep_once())["expired_finalised"] == 1

    with_store(redis_url, body, QueueConfig(group_ttl_s=0.5, min_rewarded_to_finalise=2))
    (group,) = GroupReader(r).read_batch(1, 0, 5).groups
    assert [x.rollout_id for x in group.rollouts] == ["x:0", "x:2"]
    assert r.hget(KEYS.group("y"), "state") == b"expired"
    assert 0 < r.ttl(KEYS.group_records("y")) <= QueueConfig().finished_ttl_s
