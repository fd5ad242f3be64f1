"""Turning a ``complete`` group into the bytes of its ``ReadyGroup`` record (or a drop).

The record is built by splicing the rollouts' stored msgpack bytes into the group's map
instead of unpacking every rollout into numpy arrays and packing it again: the output is
byte-for-byte what ``pack_ready_group`` produces (a test checks it), at the cost of one copy.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgpack
import redis.asyncio as aioredis

from learner.losses import group_advantages
from server.redis_schema import Keys

if TYPE_CHECKING:
    from server.store import QueueConfig

# (mode, payload, drop reason): mode "publish" with the record, or "drop" with a reason.
Decision = tuple[str, bytes, str]


def ready_group_bytes(
    group_id: str,
    metadata: dict[str, Any],
    published_at: float,
    rewards_G: list[float],
    advantages_G: list[float],
    turn_rewards_G: list[list[float] | None],
    rollouts_packed_G: list[bytes],
) -> bytes:
    """The ``pack_ready_group`` layout (same keys, same order), rollouts spliced in as is."""
    packer = msgpack.Packer()
    head = packer.pack_map_header(7)
    for key, value in (("group_id", group_id), ("metadata", metadata),
                       ("published_at", published_at), ("rewards", rewards_G),
                       ("advantages", advantages_G), ("turn_rewards", turn_rewards_G)):
        head += packer.pack(key) + packer.pack(value)
    head += packer.pack("rollouts") + packer.pack_array_header(len(rollouts_packed_G))
    return b"".join([head, *rollouts_packed_G])


def _str(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


async def build_finish(
    redis: aioredis.Redis, keys: Keys, config: QueueConfig, group_id: str
) -> Decision | None:
    """Reads a ``complete`` group and decides: publish (with advantages) or drop. None if the
    group is not ``complete``. The group cannot change meanwhile: a complete group accepts no
    reward and no rollout, and only the finish script (which re-checks the state) moves it."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(keys.group(group_id))
        pipe.lrange(keys.group_rollouts(group_id), 0, -1)
        pipe.hgetall(keys.group_rewards(group_id))
        h, rids, rewards_raw = await pipe.execute()
    if h.get(b"state") != b"complete":
        return None
    rewards = {_str(r): msgpack.unpackb(v) for r, v in rewards_raw.items()}
    rewarded = [r for r in (_str(x) for x in rids) if r in rewards]
    if not rewarded:
        return ("drop", b"", "no_rewards")
    packed = await redis.mget([keys.rollout(r) for r in rewarded])
    if any(p is None for p in packed):
        return ("drop", b"", "missing_rollouts")
    rewards_G = [float(rewards[r]["reward"]) for r in rewarded]
    if config.drop_zero_variance and max(rewards_G) == min(rewards_G):
        return ("drop", b"", "zero_variance")
    try:
        advantages_G = group_advantages(
            rewards_G, eps=config.advantage_eps, scale=config.scale_advantages).tolist()
    except ValueError:  # cannot happen for API-validated rewards; never block the sweeper
        return ("drop", b"", "invalid_rewards")
    payload = ready_group_bytes(
        group_id, msgpack.unpackb(h.get(b"metadata") or msgpack.packb({})), time.time(),
        rewards_G, advantages_G, [rewards[r]["turn_rewards"] for r in rewarded], packed)
    return ("publish", payload, "")
