"""Every Redis key name, and the msgpack records stored under them.

Keys (``{p}`` is the configurable prefix, default ``gspo``; every key carries a TTL or is
trimmed after acknowledgement, so memory stays bounded in a long run):

- ``{p}:rollout:{rollout_id}``: string, one msgpack ``RolloutRecord`` (see ``pack_rollout``)
  of a rollout recorded on its own (a multi-turn episode's; a sampled group's records share
  one key, ``{p}:group:{group_id}:records``); without a TTL once its group is published (see
  the ready stream). A rollout id whose record
  exists without its ``:group`` mapping (a published record waiting for the learner) is never
  recorded again.
- ``{p}:rollout:{rollout_id}:group``: string, the rollout's group id, same TTL as the rollout
  (lets the reward script find the group without unpacking the record: Redis's Lua msgpack
  cannot decode the binary arrays). A group recorded whole with ids of the form
  ``{group_id}:{index}`` (``member_rollout_id``; the sampling path's) has none: the id names
  its group, and the group's hash says its ids are of that form (``members``).
- ``{p}:rollout:{rollout_id}:staging``: string, a rollout record on its way in when its id may
  already be in use (a multi-turn episode recorded again): written with plain ``SET`` and
  renamed into place by the record script in the same MULTI/EXEC (large values are slow to pass
  through Lua), so it never outlives the transaction. A new group's records (ids minted for
  it) are SET straight to their ``rollout`` keys.
- ``{p}:group:{group_id}``: hash, the group's state: ``size`` (rollouts expected), ``state``
  (open | complete | published | dropped | expired), ``metadata`` (msgpack), ``created_at``,
  ``deadline`` (unix seconds after which it expires), ``n_rewarded``; once closed also
  ``completed_at``, ``partial`` (1: finalised at expiry with the rewarded rollouts it had),
  ``stream_id`` (published) or ``drop_reason`` (dropped / expired).
- ``{p}:group:{group_id}:rollouts``: list of rollout ids in the group, in creation order.
- ``{p}:group:{group_id}:rewards``: hash rollout_id -> msgpack {"reward", "turn_rewards",
  "n_turns"}.
- ``{p}:group:{group_id}:records``: string, a msgpack array of the group's rollout records in
  the order of its ``rollouts`` list (``pack_group_records``): how the sampling path records a
  group it has sampled whole (``record_group``: one write of its bytes, one key to publish,
  read and expire instead of one per rollout). The group's hash then has ``records`` (how
  many), and ``members`` (1) when its rollout ids are ``member_rollout_id``'s; its rollouts
  are never recorded one by one. Same TTL as a rollout's record, and
  the same life once published (below).
- ``{p}:episode:{rollout_id}``: hash, a multi-turn episode's state besides its trajectory
  (which is the ``{p}:rollout:{rollout_id}`` record, grown by one model turn per chat call):
  ``group_id``, ``n_turns`` (model turns recorded; the compare-and-set guard of the next one),
  ``closed`` (1 once a reward was posted: no more turns) and ``state`` (msgpack
  ``EpisodeState``: digests of the chat history the next request must extend and of the
  tools, the temperature, the last render's length/digest; deleted at close). Updated with
  the rollout record in one MULTI/EXEC (``gspo_rl.contract.queue.episodes.store``), same TTL.
  ``POST /v1/groups`` opens the group, then its ``size`` empty episodes (records without
  tokens, ``turns == []``) in one script.
- ``{p}:groups:deadlines``: sorted set group_id -> deadline (for the expiry sweeper).
- ``{p}:groups:complete``: set of group ids whose last reward arrived but which are not yet
  published (the finaliser, or the sweeper after a crash, publishes them). Only groups the
  Python credit rule decides pass through it (turn rewards, groups finalised at their
  deadline): the reward script publishes an outcome-only group in the call that completes
  it (``gspo_rl.contract.queue.groups.rewards``).
- ``{p}:stream:ready``: stream of ready groups, published *by reference*: an entry holds
  ``head`` (the ``pack_ready_group`` bytes up to the rollouts' array header: group id,
  metadata, rewards, advantages; a few hundred bytes) and ``rollouts`` (msgpack list of the
  published rollout ids, in order); their records are the ``{p}:rollout:{rollout_id}`` keys,
  left where they were written (publishing removes their TTL: they belong to the
  entry now, and the learner's trim script gives them back a TTL of 600 s when it trims the
  entry, in the same atomic step, so a trained group's trajectories stay readable a while), and
  ``head + b"".join(records)`` is exactly ``pack_ready_group``'s bytes (``join_ready_group``;
  the learner decodes the pieces without joining them:
  ``gspo_rl.contract.queue.ready.entry.unpack_entry``). An entry of a group recorded whole has a
  third field, ``records``: the group id, whose ``{p}:group:{group_id}:records`` key holds the
  records instead (publishing, the trim and the reader then touch that one key;
  ``gspo_rl.contract.queue.ready.entry``). A rollout's bytes are written once, when sampled, and
  never copied. An entry with a ``group`` field instead carries the whole record inline (how groups
  were published before; still read, e.g. by tests and tools that XADD a packed group).
- ``{p}:counters``: hash of monotonically increasing counters (published, dropped_*, ...).
- ``{p}:rewards:finished``: hash ``groups``, ``rewards`` (integers) and ``sum`` (a float) over
  every group that finished with rewards, published or dropped (equal rewards included):
  what the environment scored, read by the learner's reward target (``gspo_rl.learner.target``).
- ``{p}:servers``: hash server_id -> signed JSON registration
  (``gspo_rl.contract.queue.registry``); ``{p}:server:{id}:alive`` heartbeat
  key with a short TTL.
- ``{p}:learner:state``: hash, the learner's policy version and step, and its admission
  parameters (``gspo_rl.contract.admission``).
- ``{p}:admission:servers``: set of server ids that publish admission counts;
  ``{p}:admission:pending:{server_id}``: string, requests that server admitted and is still
  serving (their groups may not be in Redis yet), with a short TTL
  (``gspo_rl.contract.queue.inflight``).

Numeric arrays travel as little-endian bytes (int32 token ids and versions, float32
log-probabilities, uint8 masks): packing and unpacking them costs a memcpy, not a Python loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from gspo_rl.contract.credit import AdvantageConfig

DEFAULT_PREFIX = "gspo"
READY_STREAM_FIELD = "group"  # an inline entry: the whole msgpack ReadyGroup
READY_HEAD_FIELD = "head"  # a by-reference entry: pack_ready_group's bytes before the rollouts
READY_COUNT_FIELD = "rollouts"  # ... and the msgpack list of the rollout ids whose records follow
READY_RECORDS_FIELD = "records"  # ... with the group id whose one records key holds them
LEARNER_CONSUMER_GROUP = "learners"


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
    def complete(self) -> str:
        return f"{self.prefix}:groups:complete"

    @property
    def ready_stream(self) -> str:
        return f"{self.prefix}:stream:ready"

    @property
    def counters(self) -> str:
        return f"{self.prefix}:counters"

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
    def admission_servers(self) -> str:
        return f"{self.prefix}:admission:servers"

    def admission_pending(self, server_id: str) -> str:
        return f"{self.prefix}:admission:pending:{server_id}"


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
    return memoryview(np.ascontiguousarray(a, dtype=dtype).view(np.uint8))


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
    return msgpack.packb(rollout_fields(r))


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
    return msgpack.packb({
        "group_id": g.group_id,
        "metadata": g.metadata,
        "published_at": g.published_at,
        "rewards": g.rewards,
        "advantages": g.advantages,
        "turn_rewards": g.turn_rewards,
        "turn_advantages": g.turn_advantages,
        "advantage_config": g.advantage_config.to_dict() if g.advantage_config else None,
        "rollouts": [rollout_fields(r) for r in g.rollouts],
    })


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
