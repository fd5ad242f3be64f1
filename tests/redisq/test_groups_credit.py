"""The Lua copy of the outcome-only credit rule (``gspo_rl.redisq.groups.credit``) agrees
with ``gspo_rl.contract.credit`` bit for bit, and the reward script's head is ``ready_group_head``'s
bytes: random groups (sizes 1..64; equal, negative, huge, tiny, subnormal rewards; every advantage
config) against a real redis-server."""

from __future__ import annotations

import asyncio
import math
import struct
from typing import Any

import msgpack
import numpy as np
import pytest
import redis

from gspo_rl.contract.credit import AdvantageConfig, group_credit
from gspo_rl.contract.schema import READY_COUNT_FIELD, READY_HEAD_FIELD, Keys
from gspo_rl.redisq.client import make_redis
from gspo_rl.redisq.groups.credit import CREDIT_LUA
from gspo_rl.redisq.groups.finish import Snapshot, decide_finish, ready_group_head
from gspo_rl.redisq.groups.store import (
    QueueConfig,
    RewardItem,
    RolloutStore,
    pack_reward,
)
from tests.helpers.queue import make_rollout

KEYS = Keys()
CONFIGS = [AdvantageConfig(), AdvantageConfig(eps=1e-2), AdvantageConfig(eps=1 / 3),
           AdvantageConfig(eps=5e-324), AdvantageConfig(eps=1e300),
           AdvantageConfig(scale=False), AdvantageConfig(eps=0.1, scale=False)]

# ARGV: eps, scale (1/0), then groups: count, then that many 8-byte little-endian doubles.
# Returns per group the advantages as little-endian doubles, then 1/0 for the signal.
HARNESS = CREDIT_LUA + """
local out, i = {}, 3
while i <= #ARGV do
  local n, r = tonumber(ARGV[i]), {}
  for k = 1, n do r[k] = struct.unpack('<d', ARGV[i + k]) end
  local a, signal = outcome_credit(r, tonumber(ARGV[1]), ARGV[2] == '1')
  local p = {}
  for k = 1, n do p[k] = struct.pack('<d', a[k]) end
  out[#out + 1] = table.concat(p)
  out[#out + 1] = signal and 1 or 0
  i = i + n + 1
end
return out
"""


def random_rewards(rng: np.random.Generator) -> list[float]:
    """One group's rewards, drawn from the cases where summation order and rounding bite."""
    g = int(rng.integers(1, 65))
    kind = int(rng.integers(0, 9))
    if kind == 0:
        x = np.full(g, float(rng.normal()))  # all equal: no signal
    elif kind == 1:
        x = rng.integers(0, 2, g).astype(np.float64)  # pass/fail
    elif kind == 2:
        x = rng.choice([0.1, 0.2, 0.3, -0.7, 1 / 3], g)
    elif kind == 3:
        x = rng.normal(size=g) * 10.0 ** rng.integers(-300, 300)  # one scale, huge or tiny
    elif kind == 4:
        x = rng.normal(size=g) * 10.0 ** rng.integers(-300, 300, g)  # mixed scales
    elif kind == 5:
        x = rng.normal(size=g) * 5e-324 * rng.integers(1, 1000, g)  # subnormal
    elif kind == 6:
        x = rng.choice([1e308, -1e308, 1.0, 0.0], g)  # sums that overflow
    elif kind == 7:
        x = 1.0 + rng.integers(-3, 4, g) * 2.0 ** -52  # differences in the last bit
    else:
        x = rng.normal(loc=100.0, scale=1e-3, size=g)
    return [float(v) + 0.0 for v in x]


def test_lua_outcome_rule_matches_python_bit_for_bit(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    script = client.register_script(HARNESS)
    rng = np.random.default_rng(12345)
    groups = [random_rewards(rng) for _ in range(1000)]
    checked = 0
    for cfg in CONFIGS:
        for start in range(0, len(groups), 200):
            chunk = groups[start:start + 200]
            args: list[Any] = [repr(cfg.eps), int(cfg.scale)]
            for r in chunk:
                args += [len(r), *[struct.pack("<d", v) for v in r]]
            reply = script(args=args)
            for k, r in enumerate(chunk):
                want = group_credit(r, [None] * len(r), [1] * len(r), cfg.eps, cfg.scale)
                got = reply[2 * k]
                assert got == want.sequence_advantages.astype("<f8").tobytes(), (cfg, r)
                assert bool(reply[2 * k + 1]) == want.has_signal, (cfg, r)
                checked += 1
    assert checked == len(groups) * len(CONFIGS)
    client.close()


def test_reward_script_publishes_python_rule_bytes(redis_url: str) -> None:
    """Through the real reward path: groups of varied sizes, turn counts, [] or None turn
    rewards, metadata; what the script publishes or drops is what ``decide_finish`` decides,
    and the head is ``ready_group_head``'s bytes with the script's ``published_at``."""
    rng = np.random.default_rng(7)

    async def body(config: QueueConfig) -> int:
        client = make_redis(redis_url)
        store = RolloutStore(client, KEYS, config)
        await client.flushall()
        published = 0
        for g in range(60):
            gid = f"g{g}-é" if g % 5 == 0 else f"g{g}" + "x" * int(rng.integers(0, 40))
            rewards = random_rewards(rng)
            size = len(rewards)
            meta = {"prompt": "p" * int(rng.integers(0, 300)), "n": g} if g % 2 else None
            recs = [make_rollout(f"{gid}-r{i}", gid, 8, seed=i) for i in range(size)]
            await store.record_group(gid, size, meta, recs)
            turns = [int(rng.integers(0, 4)) if g % 3 == 0 else None for _ in range(size)]
            trs: list[Any] = [[] if g % 4 == 0 and i % 2 else None for i in range(size)]
            items = [RewardItem(rec.rollout_id, r, tr, n)
                     for rec, r, tr, n in zip(recs, rewards, trs, turns, strict=True)]
            stored_rewards = {it.rollout_id: pack_reward(it.reward, it.turn_rewards, it.n_turns)
                              for it in items}
            out = await store.post_rewards(items)
            assert out.applied and out.results[-1].group_complete
            # what the Python path decides for the group as stored
            decision = decide_finish(config, gid, Snapshot(
                msgpack.packb(meta or {}), [r.rollout_id for r in recs], stored_rewards))
            view = await store.get_group(gid)
            assert view is not None
            if decision.mode == "drop":
                assert (view.state, view.drop_reason) == ("dropped", decision.reason)
                continue
            assert view.state == "published" and view.stream_id
            ((_, fields),) = await client.xrange(KEYS.ready_stream, view.stream_id,
                                                 view.stream_id)
            head = fields[READY_HEAD_FIELD.encode()]
            published_at = msgpack.unpackb(head + b"\xc0" * size)["published_at"]
            assert head == _expected_head(config, gid, meta, published_at, stored_rewards,
                                          [r.rollout_id for r in recs])
            assert msgpack.unpackb(fields[READY_COUNT_FIELD.encode()]) == decision.rollout_ids
            published += 1
        assert await client.smembers(KEYS.complete) == set()
        await store.aclose()
        await client.aclose()
        return published

    total = 0
    for cfg in (QueueConfig(), QueueConfig(drop_zero_variance=False, advantage_eps=1e-2),
                QueueConfig(scale_advantages=False)):
        total += asyncio.run(asyncio.wait_for(body(cfg), 120))
    assert total > 60  # most groups publish (not all dropped)


def _expected_head(config: QueueConfig, gid: str, meta: dict | None, published_at: float,
                   stored: dict[str, bytes], rids: list[str]) -> bytes:
    entries = [msgpack.unpackb(stored[r]) for r in rids]
    rewards = [float(e["reward"]) for e in entries]
    turns = [e["n_turns"] if e["n_turns"] is not None else 1 for e in entries]
    credit = group_credit(rewards, [e["turn_rewards"] for e in entries], turns,
                          config.advantage_eps, config.scale_advantages)
    return ready_group_head(gid, meta or {}, published_at, rewards,
                            credit.sequence_advantages.tolist(),
                            [e["turn_rewards"] for e in entries],
                            [a.tolist() for a in credit.turn_advantages], config.advantage)


@pytest.mark.parametrize("turn_rewards", [[0.5], [0.0]])
def test_groups_with_turn_rewards_get_the_general_rule(redis_url: str,
                                                       turn_rewards: list[float]) -> None:
    async def body() -> None:
        client = make_redis(redis_url)
        store = RolloutStore(client, KEYS)
        recs = [make_rollout(f"r{i}", "g", 8, seed=i) for i in range(3)]
        await store.record_group("g", 3, None, recs)
        out = await store.post_rewards([RewardItem("r0", 1.0, turn_rewards),
                                        RewardItem("r1", 0.0), RewardItem("r2", 0.0)])
        assert out.applied and out.results[-1].group_complete
        view = await store.get_group("g")
        assert view is not None and view.state == "published"
        ((_, fields),) = await client.xrange(KEYS.ready_stream)
        head = msgpack.unpackb(fields[READY_HEAD_FIELD.encode()] + b"\xc0" * 3)
        assert head["turn_rewards"] == [turn_rewards, None, None]
        want = group_credit([1.0, 0.0, 0.0], [turn_rewards, None, None], [1, 1, 1])
        assert head["advantages"] == want.sequence_advantages.tolist()
        assert not math.isnan(head["published_at"])
        await store.aclose()
        await client.aclose()

    asyncio.run(asyncio.wait_for(body(), 60))
