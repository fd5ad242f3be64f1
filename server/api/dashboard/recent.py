"""The rollout browser's list: the groups that ended most recently, as Redis shows them.

Two places name recent groups: the ready stream (published groups, each entry's head holding
the rewards and advantages the learner trains with) and ``Keys.no_signal`` (groups dropped
for equal rewards, with when). The learner trims a stream entry once it acknowledges the
group, so ``RecentGroups`` remembers the newest ``KEEP`` groups it has read (the head and
the keys of the records, which stay readable for the reader's ``KEEP_TRAINED_S`` after the
trim): a group stays browsable after training, with its advantages. ``refresh`` reads the
newest ``READ`` of each (one round trip, plus one for dropped groups not seen before), at most
once per ``MIN_EVERY_S``; every request that needs the list calls it, none reads more.
"""

from __future__ import annotations

import asyncio
import builtins
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gspo_rl.contract.schema import (
    LEARNER_CONSUMER_GROUP,
    READY_STREAM_FIELD,
    Keys,
    as_str,
    unpack_ready_group,
)
from gspo_rl.redisq.ready.entry import EntryRefs, ready_entry_refs
from gspo_rl.server.api.dashboard.protocol import GroupSummary, Where

KEEP = 64
READ = 20
MIN_EVERY_S = 1.0
MAX_LIST = 256  # rewards / advantages shown per group in the list
LABELS = ("task_id", "source", "env", "difficulty", "task", "name")


def stream_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def labels_of(metadata: Any) -> dict[str, str]:
    """A few short metadata values to name a group by."""
    if not isinstance(metadata, dict):
        return {}
    return {k: str(metadata[k])[:80] for k in LABELS
            if isinstance(metadata.get(k), str | int | float) and not isinstance(
                metadata.get(k), bool)}


@dataclass
class Recent:
    """One remembered group: its summary, and where its published records are."""

    summary: GroupSummary
    ref: EntryRefs | None = None
    inline: bool = False


@dataclass
class StreamView:
    """What one read says about the ready stream's positions."""

    first: tuple[int, int] | None = None  # its oldest entry (None: empty)
    delivered: tuple[int, int] = (0, 0)  # the learner's last-delivered id
    ids: set[str] = field(default_factory=set)


class RecentGroups:
    """The newest groups read from Redis, newest first (module docstring)."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.groups: dict[str, Recent] = {}
        self._lock = asyncio.Lock()
        self._read_at = -float("inf")

    async def refresh(self, redis: Redis) -> None:
        async with self._lock:
            if time.monotonic() - self._read_at < MIN_EVERY_S:
                return
            self._read_at = time.monotonic()
            await self._read(redis)

    def list(self, limit: int) -> list[GroupSummary]:
        items = sorted(self.groups.values(), key=lambda r: r.summary.time, reverse=True)
        return [r.summary for r in items[:limit]]

    def get(self, group_id: str) -> Recent | None:
        return self.groups.get(group_id)

    def published_rewards(self) -> tuple[float | None, int]:
        """Mean reward per sample of the remembered published groups, and how many."""
        rewards = [x for r in self.groups.values() if r.summary.where != "no_signal"
                   for x in r.summary.rewards]
        n = sum(1 for r in self.groups.values() if r.summary.where != "no_signal")
        return (sum(rewards) / len(rewards) if rewards else None), n

    async def _read(self, redis: Redis) -> None:
        k = self.keys
        async with redis.pipeline(transaction=False) as pipe:
            pipe.xrevrange(k.ready_stream, count=READ)
            pipe.xrange(k.ready_stream, count=1)
            pipe.xinfo_groups(k.ready_stream)
            pipe.zrevrange(k.no_signal, 0, READ - 1, withscores=True)
            entries, first, groups, dropped = await pipe.execute(raise_on_error=False)
        for reply in (entries, first, dropped):
            if isinstance(reply, Exception):
                raise reply
        view = StreamView(first=stream_key(as_str(first[0][0])) if first else None,
                          ids={as_str(e[0]) for e in entries})
        if not isinstance(groups, Exception):  # no stream yet: an error
            for g in groups:
                if as_str(g.get("name")) == LEARNER_CONSUMER_GROUP:
                    view.delivered = stream_key(as_str(g.get("last-delivered-id")) or "0-0")
        for entry_id, fields in reversed(entries):
            self._remember_entry(as_str(entry_id), fields)
        await self._remember_dropped(redis, [(as_str(g), float(t)) for g, t in dropped])
        self._place(view)
        for gone in sorted(self.groups.values(), key=lambda r: r.summary.time)[:-KEEP]:
            del self.groups[gone.summary.group_id]

    def _remember_entry(self, entry_id: str, fields: dict[bytes, bytes]) -> None:
        ref = ready_entry_refs(self.keys, fields)
        try:
            if ref is not None:
                head = msgpack.unpackb(ref.head + b"\xc0" * len(ref.rollout_ids))
                min_version = None
            else:
                group = unpack_ready_group(fields[READY_STREAM_FIELD.encode()])
                head = {"group_id": group.group_id, "rewards": group.rewards,
                        "advantages": group.advantages, "metadata": group.metadata,
                        "published_at": group.published_at}
                min_version = group.min_version()
            gid = str(head["group_id"])
            summary = GroupSummary(
                group_id=gid, where="unread", time=float(head.get("published_at") or 0.0),
                stream_id=entry_id, size=len(head["rewards"]),
                rewards=[float(x) for x in head["rewards"][:MAX_LIST]],
                advantages=[float(x) for x in head["advantages"][:MAX_LIST]],
                min_version=min_version, labels=labels_of(head.get("metadata")))
        except (KeyError, TypeError, ValueError, msgpack.UnpackException):
            return  # not an entry this code base wrote: the learner counts it, not us
        self.groups.pop(gid, None)
        self.groups[gid] = Recent(summary, ref, inline=ref is None)

    async def _remember_dropped(self, redis: Redis,
                                dropped: builtins.list[tuple[str, float]]) -> None:
        new = [(g, t) for g, t in dropped if g not in self.groups][:READ]
        if not new:
            return
        k = self.keys
        async with redis.pipeline(transaction=False) as pipe:
            for gid, _ in new:
                pipe.hmget(k.group(gid), "size", "metadata")
                pipe.lrange(k.group_rollouts(gid), 0, MAX_LIST - 1)
                pipe.hgetall(k.group_rewards(gid))
            replies = await pipe.execute()
        for n, (gid, at) in enumerate(new):
            (size, meta), rids, rewards = replies[3 * n:3 * n + 3]
            try:
                values = [float(msgpack.unpackb(rewards[r])["reward"]) for r in rids
                          if r in rewards]
                metadata = msgpack.unpackb(meta) if meta else {}
            except (KeyError, TypeError, ValueError, msgpack.UnpackException):
                continue
            self.groups[gid] = Recent(GroupSummary(
                group_id=gid, where="no_signal", time=at, size=int(size or len(rids)),
                rewards=values, labels=labels_of(metadata)))

    def _place(self, view: StreamView) -> None:
        """Each published group's place: unread, delivered or acknowledged (trimmed)."""
        for recent in self.groups.values():
            s = recent.summary
            if s.stream_id is None:
                continue
            pos = stream_key(s.stream_id)
            where: Where
            if s.stream_id not in view.ids and (view.first is None or pos < view.first):
                where = "acknowledged"
            else:
                where = "delivered" if pos <= view.delivered else "unread"
            s.where = where


async def refresh_quietly(recent: RecentGroups, client: Redis) -> None:
    """``refresh``; a Redis failure is left for the caller's own reads to report."""
    try:
        await recent.refresh(client)
    except (RedisError, OSError):
        return
