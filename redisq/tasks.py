"""Per-task statistics, shared by every server and environment: how each task's recent groups
ended, kept in Redis under the task's id (the group metadata's ``task_id``).

When a group ends (published, or dropped for equal rewards), the server that received its
last reward records it once (``record_outcomes``, after the reward script said this call
completed the group): ``UPDATE_TASK`` adds it to the task's hash, atomically:

- ``groups``: groups of the task that ended; ``no_signal``: those whose rewards were all equal;
- ``streak`` / ``streak_value``: how many of its latest groups in a row had all rewards equal,
  and that reward (0: the last group had a learning signal);
- ``reward_ema``: the moving average of its groups' mean reward (the last group weighs
  ``ALPHA``), ``last_mean``, ``updated_at``.

A task's hash expires ``TASK_TTL_S`` after its last group. A group dropped for equal rewards
is also noted in ``Keys.no_signal`` (group id -> when), which admission counts as in flight
for a while (``gspo_rl.redisq.inflight``: the sampling budget); a group with a signal
moves ``Keys.signal_seen`` forward (the budget's drought ends). Environments read the
statistics through the server (``POST /v1/tasks/stats``: ``read_task_stats``) and choose what
to sample (``gspo_rl.client.selection``). Advisory: a failure to record is logged, never a
failed reward post.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import redis.asyncio as aioredis

from gspo_rl.contract.schema import Keys, as_str
from gspo_rl.redisq.lua import LuaScript

log = logging.getLogger(__name__)
ALPHA = 0.3
TASK_TTL_S = 30 * 86400
NO_SIGNAL_KEEP_S = 3600  # how long a no-signal drop stays noted (admission reads the recent ones)
MAX_TASK_ID = 256
SIGNAL_MEMBER = "last"  # Keys.signal_seen's one member, scored by when

UPDATE_TASK = LuaScript(
    keys=("task_key",),
    args=("mean", "equal", "now", "alpha", "ttl"),
    body="""
local mean, alpha = tonumber(mean), tonumber(alpha)
local h = redis.call('HMGET', task_key, 'reward_ema', 'streak', 'streak_value')
local ema = h[1] and (alpha * mean + (1 - alpha) * tonumber(h[1])) or mean
local streak = 0
if equal == '1' then
  streak = 1
  if h[2] and tonumber(h[2]) > 0 and tonumber(h[3]) == mean then streak = tonumber(h[2]) + 1 end
end
redis.call('HINCRBY', task_key, 'groups', 1)
if equal == '1' then redis.call('HINCRBY', task_key, 'no_signal', 1) end
redis.call('HSET', task_key, 'reward_ema', string.format('%.17g', ema), 'streak', streak,
  'streak_value', string.format('%.17g', mean), 'last_mean', string.format('%.17g', mean),
  'updated_at', now)
redis.call('EXPIRE', task_key, ttl)
return streak
""")


@dataclass(frozen=True)
class GroupOutcome:
    """A group that ended in a reward call: its id, fate ("published" or "dropped"), the
    drop's reason, its packed metadata and its final rewards."""

    group_id: str
    fate: str
    reason: str
    metadata_raw: bytes | None
    rewards: list[float]

    @property
    def task_id(self) -> str | None:
        try:
            meta = msgpack.unpackb(self.metadata_raw) if self.metadata_raw else {}
        except (ValueError, msgpack.ExtraData):
            return None
        tid = meta.get("task_id") if isinstance(meta, dict) else None
        return str(tid)[:MAX_TASK_ID] if tid not in (None, "") else None

    @property
    def equal(self) -> bool:
        return bool(self.rewards) and max(self.rewards) == min(self.rewards)


def snapshot_outcome(group_id: str, fate: str, snap: Any) -> GroupOutcome:
    """The outcome of a group the Python rule ended (``finish_group``'s result ``fate``: a
    stream id or "dropped") from the ``Snapshot`` it was decided on."""
    rewards = [float(msgpack.unpackb(snap.rewards_raw[r])["reward"])
               for r in snap.rollout_ids if r in snap.rewards_raw]
    return GroupOutcome(group_id, "dropped" if fate == "dropped" else "published", "",
                        snap.metadata_raw, rewards)


async def record_outcomes(redis: aioredis.Redis, keys: Keys, outcomes: Sequence[GroupOutcome],
                          now: float) -> None:
    """Each ended group into its task's statistics and, dropped without signal, into the
    no-signal set (one pipeline; module docstring). Never raises: logs instead."""
    todo = [(o, o.task_id) for o in outcomes if o.rewards]
    if not todo:
        return
    script = redis.register_script(UPDATE_TASK.source)
    try:
        async with redis.pipeline(transaction=False) as pipe:
            for o, task_id in todo:
                if task_id is not None:
                    k, a = UPDATE_TASK.slots(keys={"task_key": keys.task(task_id)}, args={
                        "mean": repr(sum(o.rewards) / len(o.rewards)),
                        "equal": int(o.equal), "now": repr(now), "alpha": ALPHA,
                        "ttl": TASK_TTL_S})
                    await script(keys=k, args=a, client=pipe)
                if o.fate == "dropped" and o.equal:
                    pipe.zadd(keys.no_signal, {o.group_id: now})
                elif not o.equal:
                    pipe.zadd(keys.signal_seen, {SIGNAL_MEMBER: now}, gt=True)
            pipe.zremrangebyscore(keys.no_signal, "-inf", now - NO_SIGNAL_KEEP_S)
            for key in (keys.no_signal, keys.signal_seen):  # gone after an hour without news
                pipe.expire(key, NO_SIGNAL_KEEP_S)
            await pipe.execute()
    except Exception as exc:  # noqa: BLE001 - advisory: the rewards are stored either way
        log.warning("task statistics not recorded for %d groups: %s", len(todo), exc)


FIELDS = ("groups", "no_signal", "streak", "streak_value", "reward_ema", "last_mean",
          "updated_at")


def parse_stats(raw: Sequence[Any]) -> dict[str, float] | None:
    """An ``HMGET`` of ``FIELDS`` as numbers; None for a task with no statistics."""
    if raw[0] is None:
        return None
    return {f: float(as_str(v)) if v is not None else 0.0 for f, v in zip(FIELDS, raw,
                                                                            strict=True)}


async def read_task_stats(redis: aioredis.Redis, keys: Keys,
                          task_ids: Sequence[str]) -> dict[str, dict[str, float] | None]:
    """The statistics of each task (None: no group of it has ended, or they expired)."""
    async with redis.pipeline(transaction=False) as pipe:
        for tid in task_ids:
            pipe.hmget(keys.task(tid), *FIELDS)
        replies = await pipe.execute()
    return {tid: parse_stats(r) for tid, r in zip(task_ids, replies, strict=True)}
