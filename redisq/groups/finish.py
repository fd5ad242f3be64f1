"""Deciding how a ``complete`` group ends: published with its advantages, or dropped.

The record is the ``pack_ready_group`` layout in two pieces: here the head (the group's fields
and advantages, up to the rollouts' array header, a few hundred bytes), and the rollouts'
stored msgpack records, which never leave Redis on the way: the publish script
(``PUBLISH_GROUP``) XADDs the head with the rollout ids (and the group id when its records
are one key) and keeps the records where they are (without a TTL from then on); the learner
reads them after XREADGROUP; head + the published records is byte for byte what
``pack_ready_group`` produces (``gspo_rl.redisq.ready.entry``; a test checks it).

This is the Python path, for groups the reward script does not end itself: groups with turn
rewards (the general rule, per-turn baselines), groups finalised at their deadline and groups
a crashed finisher left ``complete`` (the sweeper). Outcome-only groups are ended by the
reward script that completes them (``gspo_rl.redisq.groups.rewards``), with a Lua copy of
the outcome-only rule that gives these functions' numbers and head bytes exactly
(``gspo_rl.redisq.groups.credit``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
import redis.asyncio as aioredis

from gspo_rl.contract.credit import AdvantageConfig, group_credit
from gspo_rl.contract.schema import (
    READY_COUNT_FIELD,
    READY_HEAD_FIELD,
    READY_RECORDS_FIELD,
    Keys,
    as_str,
    key_template,
)
from gspo_rl.redisq.groups.rewards import PUBLISH_GROUP

if TYPE_CHECKING:
    from gspo_rl.redisq.groups.types import QueueConfig



@dataclass(frozen=True)
class Decision:
    mode: str  # "publish" | "drop"
    head: bytes = b""  # the record up to the rollouts (publish)
    reason: str = ""  # why (drop)
    rollout_ids: list[str] = field(default_factory=list)  # rollouts to append, in order
    rewards: list[float] = field(default_factory=list)  # the final rewards scored


def ready_group_head(
    group_id: str,
    metadata: dict[str, Any],
    published_at: float,
    rewards_G: list[float],
    advantages_G: list[float],
    turn_rewards_G: list[list[float] | None],
    turn_advantages_G: list[list[float]],
    advantage_config: AdvantageConfig,
) -> bytes:
    """``pack_ready_group``'s bytes up to and including the rollouts' array header (same keys,
    same order): appending the G packed rollouts completes the record."""
    packer = msgpack.Packer()
    head: bytes = packer.pack_map_header(9)
    for key, value in (("group_id", group_id), ("metadata", metadata),
                       ("published_at", published_at), ("rewards", rewards_G),
                       ("advantages", advantages_G), ("turn_rewards", turn_rewards_G),
                       ("turn_advantages", turn_advantages_G),
                       ("advantage_config", advantage_config.to_dict())):
        head += packer.pack(key) + packer.pack(value)
    head += packer.pack("rollouts") + packer.pack_array_header(len(rewards_G))
    return head


@dataclass(frozen=True)
class Snapshot:
    """What deciding a complete group needs: its metadata, rollout ids in creation order and
    the packed rewards by rollout id."""

    metadata_raw: bytes
    rollout_ids: list[str]
    rewards_raw: dict[str, bytes]

    @classmethod
    def from_script(cls, metadata: bytes | None, rids: list[Any], flat: list[Any]) -> Snapshot:
        """From the reward script's reply (``HGETALL`` comes back as a flat list)."""
        rewards = {as_str(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}
        return cls(metadata or msgpack.packb({}), [as_str(r) for r in rids], rewards)


async def read_snapshot(redis: aioredis.Redis, keys: Keys, group_id: str) -> Snapshot | None:
    """The group as stored, or None if it is not ``complete``. A complete group cannot change
    meanwhile: it accepts no reward and no rollout, and only the finish script (which re-checks
    the state) moves it on."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(keys.group(group_id))
        pipe.lrange(keys.group_rollouts(group_id), 0, -1)
        pipe.hgetall(keys.group_rewards(group_id))
        h, rids, rewards_raw = await pipe.execute()
    if h.get(b"state") != b"complete":
        return None
    return Snapshot(h.get(b"metadata") or msgpack.packb({}), [as_str(r) for r in rids],
                    {as_str(r): v for r, v in rewards_raw.items()})


def reward_turns(entry: dict[str, Any]) -> int:
    """An entry's model-turn count: stored with the reward (``n_turns``); entries written
    before it was stored have one per turn reward, or one (a single-turn rollout)."""
    if entry.get("n_turns") is not None:
        return int(entry["n_turns"])
    return len(entry["turn_rewards"]) if entry.get("turn_rewards") else 1


def decide_finish(config: QueueConfig, group_id: str, snap: Snapshot) -> Decision:
    """Publish (with the advantages of ``group_credit``) or drop, and why. Pure.

    Zero variance is ``group_credit``'s own verdict (every advantage exactly 0), so a group is
    dropped exactly when the learner would get nothing but zeros from it: equal final rewards
    with different turn rewards are published."""
    rewards = {r: msgpack.unpackb(v) for r, v in snap.rewards_raw.items()}
    rewarded = [r for r in snap.rollout_ids if r in rewards]
    if not rewarded:
        return Decision("drop", reason="no_rewards")
    rewards_G = [float(rewards[r]["reward"]) for r in rewarded]
    turn_rewards_G = [rewards[r]["turn_rewards"] for r in rewarded]
    adv_config = config.advantage
    try:
        credit = group_credit(rewards_G, turn_rewards_G,
                              [reward_turns(rewards[r]) for r in rewarded],
                              eps=adv_config.eps, scale=adv_config.scale)
    except ValueError:  # cannot happen for API-validated rewards; never block the sweeper
        return Decision("drop", reason="invalid_rewards")
    if config.drop_zero_variance and not credit.has_signal:
        return Decision("drop", reason="zero_variance", rewards=rewards_G)
    head = ready_group_head(
        group_id, msgpack.unpackb(snap.metadata_raw), time.time(), rewards_G,
        credit.sequence_advantages.tolist(), turn_rewards_G,
        [a.tolist() for a in credit.turn_advantages], adv_config)
    return Decision("publish", head=head, rollout_ids=rewarded, rewards=rewards_G)


def publish_call(keys: Keys, group_id: str, decision: Decision,
                 finished_ttl: int, records_ttl: int) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of the publish script (``PUBLISH_GROUP``), which carries out
    ``decision`` exactly once: the group must still be ``complete``; publishing XADDs the head
    and moves the rollout records to the entry's ready keys. ``records_ttl``: what the records
    left unpublished keep (``QueueConfig.dropped_records_ttl_s``)."""
    (r_head, r_tail), (m_head, m_tail) = key_template(keys.rollout), key_template(
        keys.rollout_group)
    b_head, b_tail = key_template(keys.group_records)
    return PUBLISH_GROUP.slots(
        keys={"group_key": keys.group(group_id), "rollouts_key": keys.group_rollouts(group_id),
              "rewards_key": keys.group_rewards(group_id), "complete_key": keys.complete,
              "counters_key": keys.counters, "stream_key": keys.ready_stream,
              "finished_key": keys.finished_rewards},
        args={"group_id": group_id, "mode": decision.mode, "reason": decision.reason,
              "finished_ttl": finished_ttl, "r_head": r_head, "r_tail": r_tail,
              "m_head": m_head, "m_tail": m_tail, "head": decision.head,
              "packed_ids": msgpack.packb(decision.rollout_ids), "head_field": READY_HEAD_FIELD,
              "ids_field": READY_COUNT_FIELD, "n_rewards": len(decision.rewards),
              "reward_sum": repr(float(sum(decision.rewards))), "b_head": b_head,
              "b_tail": b_tail, "records_field": READY_RECORDS_FIELD,
              "records_ttl": records_ttl},
        rest=decision.rollout_ids)


def publish_result(reply: list[Any]) -> str | None:
    """The publish script's reply -> the stream id, 'dropped' (also when a rollout record had
    expired: ``missing_rollouts``), or None (another finisher won the race)."""
    if not reply:
        return None
    outcome, detail = as_str(reply[0]), as_str(reply[1])
    return detail if outcome == "published" else "dropped"
