"""Multi-turn episodes in Redis: opened as a group, grown one model turn at a time, closed by
their reward.

``EpisodeStore`` is ``RolloutStore`` plus ``open_episodes`` (the group and its empty
rollouts), ``load`` (one consistent snapshot of an episode), ``commit_turn`` (replaces the
record and the state only if the turn count is still the one the turn was built on: a
concurrent turn gets a conflict) and ``post_rewards`` (closes the rewarded episodes, checking
their turn counts, then stores the rewards). Every change is one Lua script
(``episodes.scripts``); large values never pass through Lua. Requires a client with
``decode_responses=False``. docs/design/redis-protocol.md has the details."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import msgpack
import numpy as np
import redis.asyncio as aioredis
import redis.exceptions
from redis.commands.core import AsyncScript

from gspo_rl.contract.errors import StoreError, StoreReason
from gspo_rl.contract.schema import (
    Keys,
    RolloutRecord,
    as_str,
    key_template,
    pack_rollout,
    unpack_rollout,
)
from gspo_rl.redisq.episodes.scripts import (
    APPEND_TURN,
    CLOSE_EPISODES,
    LOAD_EPISODE,
    OPEN_EPISODES,
)
from gspo_rl.redisq.groups.store import (
    QueueConfig,
    RewardItem,
    RewardsOutcome,
    RolloutStore,
)
from gspo_rl.redisq.lua import template_args


@dataclass
class EpisodeState:
    """What the next turn of an episode is checked and rendered against, in a few hundred
    bytes: 16-byte digests instead of messages (``gspo_rl.server.rollouts.episodes.digest``).

    ``messages``: a digest per message of the previous request, in the form chat templates
    read; ``assistant``: the digest of the message the server produced for it (content and
    tool calls); ``tools``: the digest of the tools. ``render_len`` / ``render_hash`` /
    ``eot_count`` describe the chat template's rendering of the previous request (its length,
    a digest of its ids, how many end-of-turn tokens it holds): enough to tell whether the
    template rewrote history and where the model's turn ends in the next rendering, without
    rendering the previous request again.
    """

    messages: list[bytes]
    assistant: bytes
    tools: bytes
    temperature: float
    render_len: int
    render_hash: bytes
    eot_count: int
    history_rewrites: int = 0

    def pack(self) -> bytes:
        return cast(bytes, msgpack.packb([  # (msgpack ships no types)
            self.messages, self.assistant, self.tools, self.temperature, self.render_len,
            self.render_hash, self.eot_count, self.history_rewrites]))

    @classmethod
    def unpack(cls, data: bytes) -> EpisodeState:
        m, a, t, temp, n, h, eot, rw = msgpack.unpackb(data)
        return cls(messages=list(m), assistant=a, tools=t, temperature=float(temp),
                   render_len=int(n), render_hash=h, eot_count=int(eot),
                   history_rewrites=int(rw))


@dataclass
class Episode:
    """One consistent snapshot of an open episode (``EpisodeStore.load``)."""

    rollout_id: str
    group_id: str
    n_turns: int
    record: RolloutRecord
    state: EpisodeState | None  # None before the first turn


def empty_record(rollout_id: str, group_id: str, metadata: dict[str, Any]) -> RolloutRecord:
    """An episode before its first turn: no tokens, no turns."""
    return RolloutRecord(
        rollout_id=rollout_id, group_id=group_id, token_ids=np.zeros(0, np.int32),
        loss_mask=np.zeros(0, np.uint8), logprobs=np.zeros(0, np.float32),
        versions=np.zeros(0, np.int32), prompt_len=0, turns=[], finish_reason="length",
        created_at=time.time(), metadata=metadata)


_LOAD_ERRORS = {
    "unknown": (StoreReason.NOT_FOUND, "unknown_episode",
                "unknown episode {rid!r} (never opened with POST /v1/groups, or its records "
                "expired)"),
    "not_episode": (StoreReason.CONFLICT, "not_an_episode",
                    "rollout {rid!r} is a single-turn rollout, not a multi-turn episode: open "
                    "episodes with POST /v1/groups"),
    "finished": (StoreReason.CONFLICT, "episode_finished",
                 "episode {rid!r} is finished: a reward was posted for it, so it takes no more "
                 "turns"),
    "group_gone": (StoreReason.GONE, "group_expired", "the group of episode {rid!r} expired"),
    "group_closed": (StoreReason.GONE, "group_closed",
                     "the group of episode {rid!r} no longer accepts turns (it was finalised "
                     "or expired)"),
    "concurrent_turn": (StoreReason.CONFLICT, "concurrent_turn",
                        "another turn of episode {rid!r} was recorded while this one was "
                        "sampled: send one turn of an episode at a time"),
}


def load_error(status: str, rollout_id: str) -> StoreError:
    code = status.split(":", 1)[0]
    reason, name, message = _LOAD_ERRORS.get(
        code, (StoreReason.CONFLICT, code, "episode {rid!r}: " + code))
    return StoreError(reason, name, message.format(rid=rollout_id))


class EpisodeStore(RolloutStore):
    """``RolloutStore`` plus multi-turn episodes (see the module docstring)."""

    def __init__(
        self, redis: aioredis.Redis, keys: Keys = Keys(), config: QueueConfig = QueueConfig()
    ) -> None:
        super().__init__(redis, keys, config)
        self._open = redis.register_script(OPEN_EPISODES.source)
        self._load = redis.register_script(LOAD_EPISODE.source)
        self._append = redis.register_script(APPEND_TURN.source)
        self._close = redis.register_script(CLOSE_EPISODES.source)
        k = keys
        self._ep_tpl = {name: key_template(fn) for name, fn in (
            ("rollout", k.rollout), ("map", k.rollout_group), ("episode", k.episode),
            ("group", k.group), ("rewards", k.group_rewards))}
        self._ttl = math.ceil(config.rollout_ttl_s)

    async def open_episodes(self, group_id: str, rollout_ids: Sequence[str],
                            metadata: dict[str, Any] | None,
                            record_metadata: dict[str, Any]) -> None:
        """Opens a group of ``len(rollout_ids)`` empty episodes."""
        await self.create_group(group_id, len(rollout_ids), metadata)
        t = self._ep_tpl
        episodes: list[Any] = []
        for rid in rollout_ids:
            episodes += [rid, pack_rollout(empty_record(rid, group_id, record_metadata))]
        keys, args = OPEN_EPISODES.slots(
            keys={"group_key": self.keys.group(group_id),
                  "rollouts_key": self.keys.group_rollouts(group_id)},
            args={"group_id": group_id, "rollout_ttl": self._ttl,
                  **template_args("r", t["rollout"]),
                  **template_args("m", t["map"]), **template_args("e", t["episode"])},
            rest=episodes)
        res = as_str(await self._open(keys=keys, args=args))
        if res != "ok":
            raise StoreError(StoreReason.CONFLICT, res,
                             f"could not open the episodes of group {group_id!r}: {res}")

    async def _in_multi(self, script: AsyncScript, slots: tuple[list[Any], list[Any]],
                        before: Callable[[Any], None] = lambda pipe: None,
                        after: Callable[[Any], None] = lambda pipe: None) -> list[Any]:
        """``before``, the script with ``slots`` (its KEYS and ARGV), ``after``, in one
        MULTI/EXEC (the script loaded again if Redis restarted and forgot it). Returns the
        script's and ``after``'s replies."""
        keys, args = slots
        for _ in range(2):
            async with self.redis.pipeline(transaction=True) as pipe:
                before(pipe)
                mark = len(pipe.command_stack)
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                after(pipe)
                out = (await pipe.execute(raise_on_error=False))[mark:]
            if not isinstance(out[0], redis.exceptions.NoScriptError):
                break
            await self.redis.script_load(script.script)
        for x in out:
            if isinstance(x, Exception):
                raise x
        return out

    async def load(self, rollout_id: str) -> Episode:
        """The episode as stored; ``StoreError`` if it cannot take a turn now."""
        k, t = self.keys, self._ep_tpl
        res, raw = await self._in_multi(
            self._load, LOAD_EPISODE.slots(
                keys={"episode_key": k.episode(rollout_id), "rollout_key": k.rollout(rollout_id),
                      "mapping_key": k.rollout_group(rollout_id)},
                args={"rollout_id": rollout_id, **template_args("g", t["group"]),
                      **template_args("w", t["rewards"])}),
            after=lambda pipe: pipe.get(k.rollout(rollout_id)))
        status = as_str(res[0])
        if status != "ok" or raw is None:
            raise load_error(status if status != "ok" else "unknown", rollout_id)
        state = EpisodeState.unpack(res[3]) if res[3] else None
        return Episode(rollout_id=rollout_id, group_id=as_str(res[1]), n_turns=int(res[2]),
                       record=unpack_rollout(raw), state=state)

    async def commit_turn(self, episode: Episode, record: RolloutRecord,
                          state: EpisodeState) -> None:
        """Stores the grown record and the new state if nothing changed since ``load``."""
        k, rid, gid = self.keys, episode.rollout_id, episode.group_id
        staging = k.rollout_staging(rid)
        (res,) = await self._in_multi(
            self._append, APPEND_TURN.slots(
                keys={"episode_key": k.episode(rid), "rollout_key": k.rollout(rid),
                      "mapping_key": k.rollout_group(rid), "group_key": k.group(gid),
                      "rewards_key": k.group_rewards(gid), "staging_key": staging,
                      "active_key": k.group_activity, "counters_key": k.counters},
                args={"rollout_id": rid, "n_turns": episode.n_turns, "state": state.pack(),
                      "rollout_ttl": self._ttl, "idle_s": self.config.group_idle_s,
                      "sampled": int(record.loss_mask.sum())
                      - int(episode.record.loss_mask.sum())}),
            before=lambda pipe: pipe.set(staging, pack_rollout(record), ex=300))
        if as_str(res) != "ok":
            raise load_error(as_str(res), rid)

    async def post_rewards(self, items: Sequence[RewardItem]) -> RewardsOutcome:
        """Closes the episodes among ``items`` (checking their turn counts), then stores the
        rewards as ``RolloutStore.post_rewards`` does."""
        return await super().post_rewards(await self._close_episodes(items))

    async def _close_episodes(self, items: Sequence[RewardItem]) -> list[RewardItem]:
        """``items`` with their model-turn counts (an episode's, or 1: a single-turn
        rollout), once every episode among them is closed; raises if any item fails."""
        if not items:
            return []
        pairs: list[Any] = []
        for it in items:
            pairs += [it.rollout_id, -1 if it.turn_rewards is None else len(it.turn_rewards)]
        keys, args = CLOSE_EPISODES.slots(keys={}, args=template_args("e", self._ep_tpl["episode"]),
                                          rest=pairs)
        statuses = [as_str(s) for s in await self._close(keys=keys, args=args)]
        if all(s.startswith("ok:") or s == "not_episode" for s in statuses):
            return [replace(it, n_turns=int(s[3:]) if s.startswith("ok:") else 1)
                    for it, s in zip(items, statuses, strict=True)]
        raise _close_error(items, statuses)


def _close_error(items: Sequence[RewardItem], statuses: list[str]) -> StoreError:
    """The first failing item decides the error: a conflict with what is stored (the
    episode's turn count, an empty episode: 409); the details list every item, as the rewards
    route does for its own failures."""
    results = []
    first: tuple[StoreReason, str, str] | None = None
    for i, (it, st) in enumerate(zip(items, statuses, strict=True)):
        if st.startswith("turns:"):
            n = int(st.split(":", 1)[1])
            got = len(it.turn_rewards or [])
            code, reason = "turn_count_mismatch", StoreReason.CONFLICT
            why = (f"{got} turn_rewards for an episode with {n} model turn(s): send one per "
                   "model turn, in order, or none")
        elif st == "single_turn":
            code, reason = "turn_count_mismatch", StoreReason.CONFLICT
            why = (f"{len(it.turn_rewards or [])} turn_rewards for a rollout that is not a "
                   "multi-turn episode: a single-turn rollout has one model turn, send at "
                   "most one turn reward")
        elif st == "episode_empty":
            code, reason = "episode_empty", StoreReason.CONFLICT
            why = ("the episode has no model turn yet: run at least one chat completion "
                   "with its rollout_id before posting its reward")
        else:
            results.append({"rollout_id": it.rollout_id, "status": "not_applied"})
            continue
        results.append({"rollout_id": it.rollout_id, "status": code})
        if first is None:
            first = (reason, code, (f"item {i} " if len(items) > 1 else "")
                     + f"rollout {it.rollout_id!r}: {why}")
    assert first is not None
    reason, code, message = first
    if len(items) > 1:
        message += "; nothing in this call was stored"
    return StoreError(reason, code, message, details={"results": results})
