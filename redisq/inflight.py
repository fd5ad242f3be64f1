"""How many groups are in flight, derived from facts in Redis (no counter that could drift).

A group is in flight (``gspo_rl.contract.admission``) from its admission until it is trained
or leaves; each stage is something Redis already holds (a server's pending requests, open
groups with activity within ``group_idle_s`` (``Keys.group_activity``), complete groups, the
learner's lag on the ready stream, the batch it is training), so the count is their sum, read
in one round trip (``IN_FLIGHT_FACTS``, which the learner's drain reads too); open groups
without recent activity are reported as idle, not counted. ``InFlightCounter`` reads the
facts for a server's admission gate and publishes the server's own pending count, valid for
``PENDING_TTL_S``, so a crashed server stops counting. The servers' counts are kept with their
sum (``Keys.admission_pending_total``) by the scripts that change them, and a count whose time
is up leaves with its share of the sum: a read costs the same whatever the fleet's size
(docs/scaling.md measured the per-server keys it replaced). docs/design/redis-protocol.md
lists the stages."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self

import redis.asyncio as aioredis

from gspo_rl.contract.admission import LearnerParams, budget_counted, in_drought
from gspo_rl.contract.schema import LEARNER_CONSUMER_GROUP, Keys
from gspo_rl.redisq.connection import RedisPipe, run_script
from gspo_rl.redisq.lua import LuaScript

log = logging.getLogger(__name__)
PUBLISH_EVERY_S = 1.0
PENDING_TTL_S = 5



# Removes the pending counts whose time is up (seen score <= now) and their share of the sum:
# O(counts removed), nothing while every server publishes.
_SWEEP = """
local function sweep_pending(counts_key, seen_key, total_key, now)
  local gone = redis.call('ZRANGEBYSCORE', seen_key, '-inf', now)
  for _, id in ipairs(gone) do
    local v = tonumber(redis.call('HGET', counts_key, id) or '0')
    if v ~= 0 then redis.call('DECRBY', total_key, v) end
    redis.call('HDEL', counts_key, id)
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', seen_key, '-inf', now) end
end
"""

# A server's pending count: set (valid ttl seconds), with the sum changed by the difference.
# pending -1: the server withdraws (its count and its share of the sum removed).
PUBLISH_PENDING = LuaScript(
    keys=("counts_key", "seen_key", "total_key"),
    args=("server_id", "pending", "ttl"),
    helpers=_SWEEP,
    body="""
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
sweep_pending(counts_key, seen_key, total_key, now)
local old = tonumber(redis.call('HGET', counts_key, server_id) or '0')
local new = tonumber(pending)
if new < 0 then
  if old ~= 0 then redis.call('DECRBY', total_key, old) end
  redis.call('HDEL', counts_key, server_id)
  redis.call('ZREM', seen_key, server_id)
  return 0
end
redis.call('HSET', counts_key, server_id, new)
if new ~= old then redis.call('INCRBY', total_key, new - old) end
redis.call('ZADD', seen_key, now + tonumber(ttl), server_id)
return new
""")

IN_FLIGHT_FACTS = LuaScript(
    keys=("deadlines_key", "active_key", "complete_key", "stream_key", "learner_key",
          "counts_key", "seen_key", "total_key", "no_signal_key", "signal_key"),
    args=("server_id", "consumer_group", "hold_s", "drought_s"),
    helpers=_SWEEP,
    body="""
-- server_id: the reading server ('': none)
-- -> {open and active, complete, stream length, the group's lag (-1: unknown), other servers'
--     pending, the learner state's HGETALL, open but idle}; pending counts whose time is up
--     leave the sum first. An open group counts until its activity's score (last activity +
--     the recording server's group_idle_s) has passed; then it is idle: open, not counted.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n_open = redis.call('ZCOUNT', active_key, '(' .. string.format('%.6f', now), '+inf')
local n_idle = math.max(0, redis.call('ZCARD', deadlines_key) - n_open)
local n_complete = redis.call('SCARD', complete_key)
local depth = redis.call('XLEN', stream_key)
local lag = -1
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', stream_key)  -- no stream yet: an error
if ok then
  for _, g in ipairs(groups) do
    local name, glag = nil, false
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'lag' then glag = g[i + 1] end
    end
    if name == consumer_group then
      if glag then lag = glag end  -- a nil lag: Redis cannot say, the stream's length counts
      break
    end
  end
end
sweep_pending(counts_key, seen_key, total_key, now)
local remote = tonumber(redis.call('GET', total_key) or '0')
if server_id ~= '' then
  remote = remote - tonumber(redis.call('HGET', counts_key, server_id) or '0')
end
-- groups dropped for equal rewards hold a place until the learner's next step, at most hold_s
local held = 0
if tonumber(hold_s) > 0 then
  local since = now - tonumber(hold_s)
  local stepped = tonumber(redis.call('HGET', learner_key, 'updated_at') or '0')
  if stepped > since then since = stepped end
  held = redis.call('ZCOUNT', no_signal_key, '(' .. string.format('%.6f', since), '+inf')
end
-- a drought: no group with a signal ended within drought_s, and the first group without one
-- since the last that had one ended drought_s ago or more -> those of the window (else 0)
local dry = 0
if tonumber(drought_s) > 0 then
  local window = now - tonumber(drought_s)
  local last = tonumber(redis.call('ZSCORE', signal_key, 'last') or '0')
  if last <= window then
    local first = redis.call('ZRANGEBYSCORE', no_signal_key, '(' .. string.format('%.6f', last),
      '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if #first > 0 and tonumber(first[2]) <= window then
      dry = redis.call('ZCOUNT', no_signal_key, '(' .. string.format('%.6f', window), '+inf')
    end
  end
end
return {n_open, n_complete, depth, lag, remote, redis.call('HGETALL', learner_key), n_idle,
  held, string.format('%.3f', now), dry}
""")
"""The facts the in-flight count is made of, in one round trip (``gspo_rl.redisq.inflight``
reads it for the gate, ``gspo_rl.learner.runtime.target`` to drain); ``in_flight_call`` gives
its keys and arguments, ``InFlightFacts.from_reply`` reads its reply."""


def in_flight_call(keys: Keys, server_id: str = "", hold_s: float = 0.0,
                   drought_s: float = 0.0) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of ``IN_FLIGHT_FACTS`` for server ``server_id`` (its own pending count is
    left out: its gate knows it exactly; "": every server's counts). ``hold_s``: how long a
    group dropped for equal rewards holds a place (``InFlightFacts.no_signal``; 0: not);
    ``drought_s``: how long without any group with a signal makes a drought
    (``InFlightFacts.drought``; 0: never)."""
    return IN_FLIGHT_FACTS.slots(
        keys={"deadlines_key": keys.deadlines, "active_key": keys.group_activity,
              "complete_key": keys.complete,
              "stream_key": keys.ready_stream, "learner_key": keys.learner_state,
              "counts_key": keys.admission_pending, "seen_key": keys.admission_seen,
              "total_key": keys.admission_pending_total, "no_signal_key": keys.no_signal,
              "signal_key": keys.signal_seen},
        args={"server_id": server_id, "consumer_group": LEARNER_CONSUMER_GROUP,
              "hold_s": hold_s, "drought_s": drought_s})


@dataclass(frozen=True)
class InFlightFacts:
    """One reply of ``IN_FLIGHT_FACTS``. ``open``: open groups with recent activity (they
    count); ``idle``: open groups without (they do not: their environment or server lost
    them, or they wait long for rewards). ``undelivered``: published groups the learner has
    not read, its consumer group's lag on the ready stream (the stream's length when there is
    no such group or Redis cannot say)."""

    open: int
    complete: int
    undelivered: int
    remote_pending: int
    ready_depth: int
    learner: LearnerParams
    idle: int = 0
    no_signal: int = 0
    """Groups dropped for equal rewards since the learner's last step (within ``hold_s``):
    the sampling budget counts them as in flight (``gspo_rl.server.rollouts.admission``)."""
    now: float = 0.0
    """Redis time of the read."""
    drought: int = 0
    """Groups without a signal that ended within ``drought_s`` while no group with one did,
    for ``drought_s`` at least (0: no drought, or not asked)."""

    @property
    def in_drought(self) -> bool:
        """``gspo_rl.contract.admission.in_drought``: the budget counts every held group."""
        return in_drought(self.drought, self.learner.groups_per_step)

    def budget_counted(self, bound: int | None) -> int:
        """The ``no_signal`` groups the sampling budget counts under ``bound``
        (``gspo_rl.contract.admission.budget_counted``)."""
        return budget_counted(self.no_signal, bound, self.learner.groups_per_step,
                              self.in_drought)

    @property
    def learner_age_s(self) -> float | None:
        """Seconds since the learner's last heartbeat (None: no learner ever beat)."""
        seen = self.learner.seen_at
        return None if seen is None else max(0.0, self.now - seen)

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> Self:
        n_open, n_complete, depth, lag, remote, state, n_idle, held, now, dry = reply
        depth, lag = int(depth), int(lag)
        return cls(open=int(n_open), complete=int(n_complete),
                   undelivered=depth if lag < 0 else lag, remote_pending=int(remote),
                   ready_depth=depth,
                   learner=LearnerParams.from_hash(dict(zip(state[::2], state[1::2],
                                                            strict=True))),
                   idle=int(n_idle), no_signal=int(held), now=float(now), drought=int(dry))

    def describe(self) -> str:
        """What the count is made of, for a person: "3 open, 1 complete, ..."; the idle groups
        are named although they do not count."""
        parts = [f"{self.open} open", f"{self.complete} complete",
                 f"{self.undelivered} published unread", f"{self.learner.training} training",
                 f"{self.remote_pending} being sampled"]
        if self.no_signal:
            parts.append(f"{self.no_signal} ended without a learning signal since the "
                         "learner's last step (equal rewards: the sampling budget counts them)")
        idle = (f"; {self.idle} open but idle (no activity for group_idle_s: not counted, "
                "they expire at their deadline)" if self.idle else "")
        return ", ".join(parts) + idle


@dataclass(frozen=True)
class Snapshot(InFlightFacts):
    """One read of the in-flight facts. ``others``: everything but this server's own
    pending requests (which the gate knows exactly)."""

    @property
    def others(self) -> int:
        return (self.open + self.complete + self.undelivered + self.learner.training
                + self.remote_pending)


class InFlightCounter:
    """Reads the global facts; publishes this server's pending count."""

    def __init__(self, client: aioredis.Redis, keys: Keys, server_id: str,
                 pipe: RedisPipe | None = None, no_signal_hold_s: float = 0.0,
                 no_signal_drought_s: float = 0.0) -> None:
        """``pipe``: the connection reads go through (the store's); None: ``client``.
        ``no_signal_hold_s``, ``no_signal_drought_s``: ``in_flight_call``'s ``hold_s`` and
        ``drought_s``."""
        self.client = client
        self.keys = keys
        self.server_id = server_id
        self.pipe = pipe
        self._facts = client.register_script(IN_FLIGHT_FACTS.source)
        self._publish = client.register_script(PUBLISH_PENDING.source)
        self._keys, self._args = in_flight_call(keys, server_id, no_signal_hold_s,
                                                no_signal_drought_s)

    async def read(self) -> Snapshot:
        """The facts now, in one round trip (``IN_FLIGHT_FACTS``)."""
        return Snapshot.from_reply(await run_script(self.pipe, self.client, self._facts,
                                                    self._keys, self._args))

    def _pending_slots(self, pending: int) -> tuple[list[str], list[Any]]:
        k = self.keys
        return PUBLISH_PENDING.slots(
            keys={"counts_key": k.admission_pending, "seen_key": k.admission_seen,
                  "total_key": k.admission_pending_total},
            args={"server_id": self.server_id, "pending": pending, "ttl": PENDING_TTL_S})

    async def publish(self, pending: int) -> None:
        """This server's pending count, valid for ``PENDING_TTL_S`` (``PUBLISH_PENDING``)."""
        await run_script(None, self.client, self._publish, *self._pending_slots(max(0, pending)))

    async def publish_loop(self, pending: Callable[[], int]) -> None:
        """Publish ``pending()`` every ``PUBLISH_EVERY_S`` until cancelled (Redis errors are
        logged and retried: the key's TTL makes a silent server count as nothing)."""
        while True:
            try:
                await self.publish(pending())
            except Exception as exc:  # noqa: BLE001 - keep publishing
                log.warning("publishing the admission count failed: %s", exc)
            await asyncio.sleep(PUBLISH_EVERY_S)

    async def withdraw(self) -> None:
        """On shutdown: this server admits nothing more."""
        with contextlib.suppress(Exception):
            await run_script(None, self.client, self._publish, *self._pending_slots(-1))
