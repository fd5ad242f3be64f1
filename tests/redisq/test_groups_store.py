"""RolloutStore against a real Redis: lifecycle, errors, record format, crash recovery, TTLs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis

from gspo_rl.contract.errors import StoreReason
from gspo_rl.contract.schema import Keys, pack_ready_group, unpack_ready_group
from gspo_rl.redisq.client import make_redis
from gspo_rl.redisq.groups.store import (
    QueueConfig,
    RewardItem,
    RolloutStore,
    StoreError,
    pack_reward,
)
from gspo_rl.server.api.errors import STORE_STATUS, store_status
from tests.helpers.queue import aready_records, make_rollout, open_group

KEYS = Keys()


def run(url: str, fn: Callable[[RolloutStore], Awaitable[Any]],
        config: QueueConfig | None = None, store_cls: type[RolloutStore] = RolloutStore) -> Any:
    async def main() -> Any:
        client = make_redis(url)
        try:
            return await asyncio.wait_for(fn(store_cls(client, KEYS, config or QueueConfig())), 60)
        finally:
            await client.aclose()

    return asyncio.run(main())


async def stream(store: RolloutStore) -> list[tuple[str, bytes]]:
    return await aready_records(store.redis, KEYS)


def test_create_group_is_idempotent_and_checks_size(redis_url: str) -> None:
    async def body(store: RolloutStore) -> None:
        await store.create_group("g", 4, {"a": 1})
        await store.create_group("g", 4)  # a retried request
        with pytest.raises(StoreError) as e:
            await store.create_group("g", 5)
        assert store_status(e.value) == 409 and e.value.code == "group_exists"
        for bad in (0, -1, 5000):
            with pytest.raises(StoreError) as e:
                await store.create_group(f"bad{bad}", bad)
            assert store_status(e.value) == 422
        view = await store.get_group("g")
        assert view is not None and view.state == "open" and view.metadata == {"a": 1}
        assert (await store.counters())["groups_created"] == 1

    run(redis_url, body)


def test_record_rollout_errors_and_rerecording(redis_url: str) -> None:
    async def body(store: RolloutStore) -> None:
        with pytest.raises(StoreError) as e:
            await store.record_rollout(make_rollout("x", "nope"))
        assert (store_status(e.value), e.value.code) == (404, "unknown_group")
        ids = await open_group(store, "g", 2)
        with pytest.raises(StoreError) as e:
            await store.record_rollout(make_rollout("third", "g"))
        assert (store_status(e.value), e.value.code) == (409, "group_full")
        await store.create_group("h", 2)
        with pytest.raises(StoreError) as e:
            await store.record_rollout(make_rollout(ids[0], "h"))
        assert e.value.code == "rollout_in_other_group"
        longer = make_rollout(ids[0], "g", n_tokens=40)  # a multi-turn episode grew
        await store.record_rollout(longer)
        assert (await store.get_group("g")).rollout_ids == ids  # type: ignore[union-attr]
        await store.post_rewards([RewardItem(ids[0], 1.0)])
        with pytest.raises(StoreError) as e:
            await store.record_rollout(longer)
        assert (store_status(e.value), e.value.code) == (409, "rollout_rewarded")
        await store.post_rewards([RewardItem(ids[1], 0.0)])  # completes and publishes "g"
        with pytest.raises(StoreError) as e:
            await store.record_rollout(make_rollout("late", "g"))
        assert (store_status(e.value), e.value.code) == (410, "group_closed")
        ((_, data),) = await stream(store)
        assert len(unpack_ready_group(data).rollouts[0].token_ids) == 40

    run(redis_url, body)


def test_published_record_is_exactly_pack_ready_group(redis_url: str) -> None:
    async def body(store: RolloutStore) -> None:
        ids = await open_group(store, "g", 3, n_tokens=50, version=7)
        await store.post_rewards([RewardItem(ids[0], 1.0, [0.25, 0.75]),
                                  RewardItem(ids[1], -2.5), RewardItem(ids[2], 0.5)])
        ((_, data),) = await stream(store)
        group = unpack_ready_group(data)
        assert pack_ready_group(group) == data  # byte for byte the contract's layout
        assert group.metadata == {"prompt": "g"} and group.min_version() == 7
        assert group.turn_rewards == [[0.25, 0.75], None, None]
        assert abs(sum(group.advantages)) < 1e-5

    run(redis_url, body)


def test_zero_variance_groups_are_dropped_and_counted(redis_url: str) -> None:
    async def body(store: RolloutStore) -> None:
        ids = await open_group(store, "flat", 3)
        out = await store.post_rewards([RewardItem(i, 1.0) for i in ids])
        assert out.applied and out.results[-1].group_complete
        view = await store.get_group("flat")
        assert view is not None and (view.state, view.drop_reason) == ("dropped", "zero_variance")
        assert await stream(store) == []
        assert (await store.counters())["groups_dropped_zero_variance"] == 1

    run(redis_url, body)

    async def keep(store: RolloutStore) -> None:
        ids = await open_group(store, "flat2", 2)
        await store.post_rewards([RewardItem(i, 0.0) for i in ids])
        ((_, data),) = await stream(store)
        assert unpack_ready_group(data).advantages == [0.0, 0.0]

    run(redis_url, keep, QueueConfig(drop_zero_variance=False))


class DiesAfterRewardScript(RolloutStore):
    """A process that dies right after the reward script completed a group (before it
    publishes): a group the script left to the Python rule stays in the ``complete`` set."""

    async def _finish_safely(self, group_id: str, snapshot: Any) -> None:
        return None


def test_outcome_only_groups_are_published_by_the_reward_script_itself(redis_url: str) -> None:
    async def body(store: RolloutStore) -> None:
        ids = await open_group(store, "g", 2)
        out = await store.post_rewards([RewardItem(ids[0], 0.0), RewardItem(ids[1], 1.0)])
        assert out.results[1].group_complete
        # no crash window: the group never waits in the complete set
        assert await store.redis.smembers(KEYS.complete) == set()
        view = await store.get_group("g")
        assert view is not None and view.state == "published" and view.stream_id
        assert len(await stream(store)) == 1

    run(redis_url, body, store_cls=DiesAfterRewardScript)


def test_group_left_complete_by_a_crash_is_published_once(redis_url: str) -> None:
    async def crash(store: RolloutStore) -> None:
        ids = await open_group(store, "g", 2)
        # turn rewards: the Python rule's path, reward script then publish script
        out = await store.post_rewards([RewardItem(ids[0], 0.0, [0.5]),
                                        RewardItem(ids[1], 1.0)])
        assert out.results[1].group_complete
        assert await store.redis.smembers(KEYS.complete) == {b"g"}
        assert await stream(store) == []

    run(redis_url, crash, store_cls=DiesAfterRewardScript)

    async def recover(store: RolloutStore) -> None:
        assert (await store.sweep_once())["stuck_published"] == 0  # not stuck long enough yet
        fast = RolloutStore(store.redis, KEYS, QueueConfig(stuck_complete_s=0))
        results = await asyncio.gather(fast.sweep_once(), fast.sweep_once(),
                                       *[fast.finish_group("g") for _ in range(8)])
        assert len(await stream(store)) == 1  # many racing finishers, one XADD
        published = [x for x in results[2:] if x not in (None, "dropped")]
        stuck = sum(x["stuck_published"] for x in results[:2])
        assert len(published) + stuck == 1
        assert await store.redis.smembers(KEYS.complete) == set()
        assert (await store.counters())["groups_published"] == 1

    run(redis_url, recover)


def test_run_sweeper_expires_groups_and_is_cancellable(redis_url: str) -> None:
    async def body(store: RolloutStore) -> None:
        await open_group(store, "g", 2)
        task = asyncio.create_task(store.run_sweeper(interval_s=0.01))
        for _ in range(2000):  # bounded wait for the 50 ms deadline and a sweep
            view = await store.get_group("g")
            if view is not None and view.state != "open":
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
        assert view is not None and view.state == "expired"
        assert await store.redis.zcard(KEYS.deadlines) == 0
        assert (await store.counters())["groups_expired_dropped"] == 1

    run(redis_url, body, QueueConfig(group_ttl_s=0.05))


def test_every_key_has_a_ttl_and_finished_groups_shrink(redis_url: str) -> None:
    async def body(store: RolloutStore) -> None:
        ids = await open_group(store, "g", 3)
        await store.post_rewards([RewardItem(ids[0], 1.0)])
        r = store.redis
        for key in [KEYS.group("g"), KEYS.group_rollouts("g"), KEYS.group_rewards("g"),
                    KEYS.rollout(ids[0]), KEYS.rollout_group(ids[0])]:
            assert 600 <= await r.ttl(key) <= 3600 + 1, key
        await store.post_rewards([RewardItem(ids[1], 0.0), RewardItem(ids[2], 0.5)])
        for key in [KEYS.group("g"), KEYS.group_rollouts("g"), KEYS.group_rewards("g"),
                    *[KEYS.rollout_group(i) for i in ids]]:
            assert 0 < await r.ttl(key) <= 20, key
        # Published by reference: the records belong to the stream entry now, without a TTL;
        # the learner's trim deletes them with it (test_reader, test_queue_by_reference).
        published = [KEYS.rollout(i) for i in ids]
        assert [await r.ttl(k) for k in published] == [-1, -1, -1]
        async for key in r.scan_iter("*"):
            if key.decode() not in (KEYS.counters, KEYS.finished_rewards, KEYS.ready_stream,
                                    KEYS.deadlines, *published):  # fixed-size totals kept
                assert await r.ttl(key) > 0, key

    run(redis_url, body, QueueConfig(group_ttl_s=600, finished_ttl_s=20))


def test_reward_bytes_are_canonical() -> None:
    assert pack_reward(-0.0, None) == pack_reward(0.0, None)
    assert pack_reward(1, [2]) == pack_reward(1.0, [2.0])
    assert pack_reward(1.0, []) != pack_reward(1.0, None)
    assert msgpack.unpackb(pack_reward(0.5, [1.0])) == {"reward": 0.5, "turn_rewards": [1.0],
                                                       "n_turns": None}


def test_rejects_a_decoding_client(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    with pytest.raises(ValueError, match="decode_responses"):
        RolloutStore(client)


def test_record_rollouts_pipelined_and_after_a_script_flush(redis_url: str) -> None:
    async def body(store: RolloutStore) -> None:
        await store.create_group("g", 3)
        await store.redis.script_flush()  # as after a Redis restart: scripts are reloaded
        await store.record_rollouts([make_rollout(f"r{i}", "g", seed=i) for i in range(3)])
        view = await store.get_group("g")
        assert view is not None and view.rollout_ids == ["r0", "r1", "r2"]
        with pytest.raises(StoreError) as e:
            await store.record_rollouts([make_rollout("r0", "g"), make_rollout("r3", "g")])
        assert e.value.code == "group_full"
        await store.redis.script_flush()
        out = await store.post_rewards([RewardItem(f"r{i}", float(i)) for i in range(3)])
        assert out.applied and out.results[2].group_complete
        assert len(await stream(store)) == 1

    run(redis_url, body)




def test_the_redis_layer_speaks_no_http() -> None:
    """Storage errors carry a storage reason; only the server's HTTP layer maps them to HTTP
    (``gspo_rl.server.api.errors``); no module of the Redis protocol imports an HTTP framework."""
    import ast
    from pathlib import Path

    from starlette.exceptions import HTTPException

    assert not issubclass(StoreError, HTTPException)
    assert set(STORE_STATUS) == set(StoreReason)  # every reason has exactly one status
    root = Path(__file__).resolve().parents[2] / "redisq"
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root)
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                     for a in n.names}
        http = {m for m in imported if m and m.split(".")[0] in ("fastapi", "starlette")}
        assert not http and "gspo_rl.server.api.errors" not in imported, (name, http)


def test_without_the_pipelined_connection_the_scripts_run_through_redis_py(
        redis_url: str) -> None:
    """A client the store cannot pipeline itself (unix socket, TLS) runs the same scripts
    through redis-py: the arguments encoded once (``encode_args``) are sent as themselves."""
    from gspo_rl.redisq.connection import _encode, _encode_py, encode_args

    plain: list[bytes] = []
    _encode_py(("EVALSHA", "s", 0, "a", b"b" * 5000, 3, 1.5, "\u00e9"), plain)
    for cmd in [("EVALSHA", "s", 0, encode_args("a", b"b" * 5000, 3), 1.5, "\u00e9"),
                ("EVALSHA", "s", 0, "a", b"b" * 5000, 3, 1.5, "\u00e9"),
                (encode_args("EVALSHA", "s", 0), "a", b"b" * 5000, encode_args(3, 1.5, "\u00e9"))]:
        for encode in (_encode, _encode_py):  # hiredis's C packer, and without it
            pieces: list[bytes] = []
            encode(cmd, pieces)
            assert b"".join(pieces) == b"".join(plain), (cmd, encode)

    async def body(store: RolloutStore) -> None:
        await store.aclose()
        store._pipe = None
        recs = [make_rollout(f"r{i}", "g", seed=i) for i in range(2)]
        await store.record_group("g", 2, None, recs)
        out = await store.post_rewards([RewardItem("r0", 0.0), RewardItem("r1", 1.0)])
        assert out.applied and out.results[1].group_complete
        assert len(await stream(store)) == 1

    run(redis_url, body)


def test_a_dropped_group_keeps_a_tombstone_not_its_records(redis_url: str) -> None:
    """``dropped_records_ttl_s``: the token records of groups that end unpublished go (0: at
    once) while the group's state stays ``finished_ttl_s`` and still answers late rewards; by
    each way a group can end unpublished: the reward script, the publish script (turn rewards:
    the Python rule), expiry, and a group recorded whole."""
    async def body(store: RolloutStore) -> None:
        r = store.redis
        flat = await open_group(store, "flat", 2)  # dropped in the reward script
        await store.post_rewards([RewardItem(i, 1.0) for i in flat])
        turns = await open_group(store, "turns", 2)  # dropped by the Python rule
        await store.post_rewards([RewardItem(i, 0.5, [0.5]) for i in turns])
        late = await open_group(store, "late", 3)  # expires with one reward
        await store.post_rewards([RewardItem(late[0], 1.0)])
        await store.record_group("whole", 2, None,
                                 [make_rollout(f"w{i}", "whole", seed=i) for i in range(2)])
        await store.post_rewards([RewardItem(f"w{i}", 0.0) for i in range(2)])
        assert await store.abandon_group("late") == "expired"
        for gid, reason in (("flat", "zero_variance"), ("turns", "zero_variance"),
                            ("late", "abandoned"), ("whole", "zero_variance")):
            view = await store.get_group(gid)
            assert view is not None and view.drop_reason == reason, gid
            assert 500 < await r.ttl(KEYS.group(gid)) <= 600, gid
        gone = [KEYS.rollout(i) for i in flat + turns + late] + [KEYS.group_records("whole")]
        assert await r.exists(*gone) == 0, "the records went with the drop"
        # the tombstone answers: a repeated reward is a duplicate, a new one is refused
        again = await store.post_rewards([RewardItem(flat[0], 1.0)])
        assert [x.status for x in again.results] == ["duplicate"]
        refused = await store.post_rewards([RewardItem(late[1], 1.0)])
        assert not refused.applied and [x.status for x in refused.results] == ["expired"]
        assert await stream(store) == []

    run(redis_url, body, QueueConfig(dropped_records_ttl_s=0, finished_ttl_s=600,
                                     group_ttl_s=600))

    async def kept(store: RolloutStore) -> None:  # the default: kept a minute, for browsing
        ids = await open_group(store, "flat-kept", 2)
        await store.post_rewards([RewardItem(i, 1.0) for i in ids])
        assert 0 < await store.redis.ttl(KEYS.rollout(ids[0])) <= 60
        assert await store.redis.ttl(KEYS.group("flat-kept")) > 500

    run(redis_url, kept, QueueConfig(finished_ttl_s=600))
