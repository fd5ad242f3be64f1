"""A group as Redis holds it, read in one transaction (``read_group``): its hash, its rollout
ids and its rewards, as a ``GroupView`` (``gspo_rl.redisq.groups.types``). What
``RolloutStore.get_group``, the groups route and the dashboard show."""

from __future__ import annotations

import msgpack
import redis.asyncio as aioredis

from gspo_rl.contract.schema import Keys, as_str
from gspo_rl.redisq.groups.types import GroupView


async def read_group(redis: aioredis.Redis, keys: Keys, group_id: str) -> GroupView | None:
    """The group ``group_id`` (None: unknown, or its keys expired)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(keys.group(group_id))
        pipe.lrange(keys.group_rollouts(group_id), 0, -1)
        pipe.hgetall(keys.group_rewards(group_id))
        h, rids, rewards = await pipe.execute()
    if not h:
        return None
    h = {as_str(a): as_str(b) if a != b"metadata" else b for a, b in h.items()}
    return GroupView(
        group_id=group_id, state=h["state"], size=int(h["size"]),
        n_rewarded=int(h.get("n_rewarded") or 0), created_at=float(h["created_at"]),
        deadline=float(h["deadline"]), metadata=msgpack.unpackb(h["metadata"]),
        rollout_ids=[as_str(r) for r in rids],
        rewards={as_str(r): msgpack.unpackb(v) for r, v in rewards.items()},
        partial=h.get("partial") == "1", stream_id=h.get("stream_id"),
        drop_reason=h.get("drop_reason"),
    )
