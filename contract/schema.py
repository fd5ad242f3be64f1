"""Every Redis key name, and the msgpack records stored under them: what the servers and the
learner agree on (the Redis code that writes and reads them is ``gspo_rl.redisq``).

``Keys`` is the only place in the code base that spells a key (``{p}`` is the configurable
prefix, default ``gspo``); a Lua script that looks an id up builds its key from a
``key_template`` (``head .. id .. tail``). The records: ``RolloutRecord`` (one episode's
trajectory in token space) and ``ReadyGroup`` (a complete group with its rewards and
advantages, as the learner reads it); numeric arrays travel as little-endian bytes, so packing
costs a memcpy. Every key carries a TTL or is trimmed after acknowledgement, so memory stays
bounded in a long run. docs/design/redis-protocol.md lists every key and its life."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import msgpack
import numpy as np

from gspo_rl.contract.credit import AdvantageConfig

DEFAULT_PREFIX = "gspo"
READY_STREAM_FIELD = "group"  # an inline entry: the whole msgpack ReadyGroup
READY_HEAD_FIELD = "head"  # a by-reference entry: pack_ready_group's bytes before the rollouts
READY_COUNT_FIELD = "rollouts"  # ... and the msgpack list of the rollout ids whose records follow
READY_RECORDS_FIELD = "records"  # ... with the group id whose one records key holds them
LEARNER_CONSUMER_GROUP = "learners"
# ``Keys.learner_state`` fields: the mean reward per sample of the groups the learner's last
# step trained, the same over its last ``REWARD_TRAINED_STEPS`` steps, and that count
# (``gspo_rl.learner.runtime.published.TrainedRewards``; the dashboard's rewards).
REWARD_TRAINED = "reward_trained"
REWARD_TRAINED_RECENT = "reward_trained_recent"
REWARD_TRAINED_STEPS = "reward_trained_steps"


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix. The only place in the code base that spells a key."""

    prefix: str = DEFAULT_PREFIX

    def rollout(self, rollout_id: str) -> str:
        return f"{self.prefix}:rollout:{rollout_id}"

    def rollout_group(self, rollout_id: str) -> str:
        return f"{self.prefix}:rollout:{rollout_id}:group"

    def episode(self, rollout_id: str) -> str:
        return f"{self.prefix}:episode:{rollout_id}"

    def token_ratios(self, rollout_id: str) -> str:
        """A trained rollout's per-token log importance ratios (``gspo_rl.contract.ratios``)."""
        return f"{self.prefix}:rollout:{rollout_id}:ratios"

    def rollout_staging(self, rollout_id: str) -> str:
        return f"{self.prefix}:rollout:{rollout_id}:staging"

    def group(self, group_id: str) -> str:
        return f"{self.prefix}:group:{group_id}"

    def group_rollouts(self, group_id: str) -> str:
        return f"{self.prefix}:group:{group_id}:rollouts"

    def group_rewards(self, group_id: str) -> str:
        return f"{self.prefix}:group:{group_id}:rewards"

    def group_records(self, group_id: str) -> str:
        return f"{self.prefix}:group:{group_id}:records"

    @property
    def deadlines(self) -> str:
        return f"{self.prefix}:groups:deadlines"

    @property
    def group_activity(self) -> str:
        """Open groups -> until when they count as in flight (their last activity plus the
        recording server's ``QueueConfig.group_idle_s``)."""
        return f"{self.prefix}:groups:active"

    @property
    def complete(self) -> str:
        return f"{self.prefix}:groups:complete"

    @property
    def ready_stream(self) -> str:
        return f"{self.prefix}:stream:ready"

    @property
    def eval_stream(self) -> str:
        return f"{self.prefix}:stream:evals"

    @property
    def counters(self) -> str:
        return f"{self.prefix}:counters"

    def task(self, task_id: str) -> str:
        """A task's statistics (``gspo_rl.redisq.tasks``)."""
        return f"{self.prefix}:task:{task_id}"

    @property
    def no_signal(self) -> str:
        """Groups dropped for equal rewards -> when (``gspo_rl.redisq.tasks``)."""
        return f"{self.prefix}:groups:no_signal"

    @property
    def signal_seen(self) -> str:
        """When the last group with a learning signal ended (member ``last``, a sorted set
        kept at its maximum; ``gspo_rl.redisq.tasks``)."""
        return f"{self.prefix}:groups:signal_seen"

    @property
    def finished_rewards(self) -> str:
        return f"{self.prefix}:rewards:finished"

    @property
    def servers(self) -> str:
        return f"{self.prefix}:servers"

    def server_alive(self, server_id: str) -> str:
        return f"{self.prefix}:server:{server_id}:alive"

    @property
    def learner_state(self) -> str:
        return f"{self.prefix}:learner:state"

    @property
    def admission_pending(self) -> str:
        """Hash: server id -> the requests it is sampling now (its admission gate's count)."""
        return f"{self.prefix}:admission:pending_counts"

    @property
    def admission_pending_total(self) -> str:
        """The sum of ``admission_pending``'s values, kept with them by the same scripts."""
        return f"{self.prefix}:admission:pending_total"

    @property
    def admission_seen(self) -> str:
        """Sorted set: server id -> until when (Redis time) its pending count holds."""
        return f"{self.prefix}:admission:seen"


@dataclass
class RolloutRecord:
    """One episode's trajectory: everything the learner needs, in token space.

    ``token_ids`` is the whole sequence the model saw and wrote (prompt, model turns, tool and
    user turns, template tokens). ``loss_mask`` is 1 on tokens the model sampled, 0 elsewhere;
    ``logprobs`` and ``versions`` hold the behavior log-probability and the policy version of
    each sampled token (0.0 and -1 where the mask is 0). ``turns`` lists the ``[start, end)``
    token spans of the model's turns (one span for a single-turn rollout).
    """

    rollout_id: str
    group_id: str
    token_ids: np.ndarray  # int32 [L]
    loss_mask: np.ndarray  # uint8 [L]
    logprobs: np.ndarray  # float32 [L]
    versions: np.ndarray  # int32 [L]
    prompt_len: int  # tokens before the first model token
    temperature: float = 1.0  # the learner recomputes log_softmax(logits / temperature)
    top_p: float = 1.0  # 1: off; with top_k, the cut the sampler made (and the learner redoes)
    top_k: int = 0  # <= 0: off
    turns: list[tuple[int, int]] = field(default_factory=list)
    finish_reason: str = "length"
    created_at: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def completion_token_ids(self) -> np.ndarray:
        return self.token_ids[self.prompt_len:]

    def min_version(self) -> int:
        sampled = self.versions[self.loss_mask.astype(bool)]
        return int(sampled.min()) if sampled.size else -1


def _bin(a: np.ndarray, dtype: str) -> memoryview:
    """An array's bytes in ``dtype`` without copying them (msgpack packs a buffer as bin)."""
    return memoryview(np.ascontiguousarray(a, dtype=dtype).view(np.uint8))  # type: ignore[arg-type]  # numpy: __buffer__ on Python >= 3.12 only


def rollout_fields(r: RolloutRecord) -> dict[str, Any]:
    """The record as ``pack_rollout`` packs it (arrays as little-endian bytes)."""
    return {
        "rollout_id": r.rollout_id,
        "group_id": r.group_id,
        "token_ids": _bin(r.token_ids, "<i4"),
        "loss_mask": _bin(r.loss_mask, "u1"),
        "logprobs": _bin(r.logprobs, "<f4"),
        "versions": _bin(r.versions, "<i4"),
        "prompt_len": r.prompt_len,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": r.top_k,
        "turns": [list(t) for t in r.turns],
        "finish_reason": r.finish_reason,
        "created_at": r.created_at,
        "metadata": r.metadata,
    }


def pack_rollout(r: RolloutRecord) -> bytes:
    return cast(bytes, msgpack.packb(rollout_fields(r)))  # (msgpack ships no types)


_I4, _U1, _F4 = np.dtype("<i4"), np.dtype("u1"), np.dtype("<f4")  # (parsing "<i4": ~1 us)


def rollout_from_dict(d: dict[str, Any]) -> RolloutRecord:
    return RolloutRecord(
        rollout_id=d["rollout_id"],
        group_id=d["group_id"],
        token_ids=np.frombuffer(d["token_ids"], dtype=_I4),
        loss_mask=np.frombuffer(d["loss_mask"], dtype=_U1),
        logprobs=np.frombuffer(d["logprobs"], dtype=_F4),
        versions=np.frombuffer(d["versions"], dtype=_I4),
        prompt_len=int(d["prompt_len"]),
        temperature=float(d.get("temperature", 1.0)),
        top_p=float(d.get("top_p", 1.0)),
        top_k=int(d.get("top_k", 0)),
        turns=[(int(a), int(b)) for a, b in d.get("turns", [])],
        finish_reason=d.get("finish_reason", "length"),
        created_at=float(d.get("created_at", 0.0)),
        metadata=d.get("metadata", {}),
    )


def unpack_rollout(data: bytes) -> RolloutRecord:
    return rollout_from_dict(msgpack.unpackb(data))


@dataclass
class ReadyGroup:
    """A complete group, as published on the ready stream and read by the learner.

    ``rewards[i]``, ``advantages[i]``, ``turn_rewards[i]`` and ``turn_advantages[i]`` belong
    to ``rollouts[i]``. Both kinds of advantage come from one call of
    ``gspo_rl.contract.credit.group_credit`` when the group completes: ``advantages`` one per
    rollout (``--loss gspo``), ``turn_advantages`` one per model turn (the per-token kinds);
    empty in records written before they were published. ``advantage_config`` is the
    ``AdvantageConfig`` they were computed with (None in records written before it was
    recorded: the learner then uses the defaults).
    """

    group_id: str
    rollouts: list[RolloutRecord]
    rewards: list[float]
    advantages: list[float]
    turn_rewards: list[list[float] | None]
    metadata: dict[str, Any] = field(default_factory=dict)
    published_at: float = 0.0
    turn_advantages: list[list[float]] = field(default_factory=list)
    advantage_config: AdvantageConfig | None = None

    def min_version(self) -> int:
        """The oldest policy version of any sampled token in the group (for staleness)."""
        versions = [v for v in (r.min_version() for r in self.rollouts) if v >= 0]
        return min(versions) if versions else -1


def pack_ready_group(g: ReadyGroup) -> bytes:
    return cast(bytes, msgpack.packb({
        "group_id": g.group_id,
        "metadata": g.metadata,
        "published_at": g.published_at,
        "rewards": g.rewards,
        "advantages": g.advantages,
        "turn_rewards": g.turn_rewards,
        "turn_advantages": g.turn_advantages,
        "advantage_config": g.advantage_config.to_dict() if g.advantage_config else None,
        "rollouts": [rollout_fields(r) for r in g.rollouts],
    }))


def ready_group_from_dict(d: dict[str, Any], rollouts: list[RolloutRecord]) -> ReadyGroup:
    return ReadyGroup(
        group_id=d["group_id"],
        rollouts=rollouts,
        rewards=[float(x) for x in d["rewards"]],
        advantages=[float(x) for x in d["advantages"]],
        turn_rewards=d["turn_rewards"],
        metadata=d.get("metadata", {}),
        published_at=float(d.get("published_at", 0.0)),
        turn_advantages=[[float(a) for a in t] for t in d.get("turn_advantages", [])],
        advantage_config=(AdvantageConfig.from_dict(d["advantage_config"])
                          if d.get("advantage_config") else None),
    )


def unpack_ready_group(data: bytes) -> ReadyGroup:
    d = msgpack.unpackb(data)
    return ready_group_from_dict(d, [rollout_from_dict(r) for r in d["rollouts"]])


def join_ready_group(head: bytes, records: list[bytes]) -> bytes:
    """A by-reference entry's head and its rollout records (in order) -> the bytes
    ``pack_ready_group`` would produce for the group (``unpack_ready_group`` reads them)."""
    return b"".join([head, *records])


def key_template(fn: Callable[[str], str]) -> list[str]:
    """``Keys`` method -> [head, tail], so that a Lua script builds the key of an id it looked
    up as ``head .. id .. tail`` (``Keys`` stays the only place that spells a key)."""
    head, tail = fn("\x00").split("\x00")
    return [head, tail]


def member_rollout_id(group_id: str, index: int) -> str:
    """The id of rollout ``index`` (0-based, in the group's order) of a group recorded whole
    with ids of this form (what the sampling path mints): the id names its group, so it needs
    no ``{p}:rollout:{id}:group`` key; ``member_of`` reads it back."""
    return f"{group_id}:{index}"


def member_of(rollout_id: str) -> tuple[str, int] | None:
    """``member_rollout_id``'s (group id, index), or None for an id not of that form (it is
    the group's only if its group was recorded with such ids)."""
    gid, sep, k = rollout_id.rpartition(":")
    if not sep or not gid or not k.isdigit() or not k.isascii() or str(int(k)) != k:
        return None
    return gid, int(k)


def as_str(v: bytes | str | None) -> str:
    """A Redis reply as text (the clients here use ``decode_responses=False``); None -> ""."""
    return v.decode() if isinstance(v, bytes) else (v or "")
