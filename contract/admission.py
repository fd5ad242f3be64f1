"""The admission rule shared by the learner (which publishes its parameters) and the servers
(which hold new groups back): how many groups may be in flight so that none arrives staler
than the learner accepts.

A group is *in flight* from its admission (a request that starts a group was let through)
until the learner trains it or it leaves otherwise (dropped for equal rewards, expired, the
request failed). The learner trains ``groups_per_step`` (G) groups per policy version and
drops groups older than ``max_staleness`` (S) versions. Groups reach it in about the order they
were admitted, so a group admitted while ``n`` others are in flight (the learner's current
batch included) is trained ``ceil((n + 1) / G) - 1`` versions after the current one. Its
oldest token carries the server's version, which trails the learner's by ``lag`` while a
push is on its way (or between pushes with ``sync_every`` > 1). So it is trained within the
bound exactly when::

    n + 1 <= (S + 1 - lag) * G          (AReaL's bounded in-flight rule, with the lag)

``capacity`` is the right-hand side; ``None`` when the learner keeps everything
(``max_staleness`` unset). With no learner published yet, servers use the capacity the
learner's parameters would give at lag 0 if known, else their own fallback.

The learner publishes, in ``Keys.learner_state`` (a hash, next to ``version`` and ``step``):
``max_staleness`` (-1: none), ``groups_per_step``, ``training`` (groups of the batch it is
training now, 0 between steps) and ``finished`` (empty while it trains; once it has met its
goal, e.g. a target reward (``gspo_rl.learner.target``), why it stops: servers then start no new
group, 503 ``training_finished``, until a learner publishes an empty ``finished`` again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gspo_rl.contract.redis_schema import LEARNER_CONSUMER_GROUP, Keys

FIELD_VERSION = "version"
FIELD_MAX_STALENESS = "max_staleness"
FIELD_GROUPS_PER_STEP = "groups_per_step"
FIELD_TRAINING = "training"
FIELD_FINISHED = "finished"


def capacity(max_staleness: int | None, groups_per_step: int, lag: int = 0) -> int | None:
    """Most groups in flight such that the newest is trained within ``max_staleness``
    versions; ``None``: no bound. ``lag``: learner version minus the sampling server's."""
    if max_staleness is None or max_staleness < 0:
        return None
    return max(0, (max_staleness + 1 - max(0, lag)) * max(1, groups_per_step))


def admits(in_flight: int, bound: int | None) -> bool:
    """Whether one more group may start while ``in_flight`` are in flight."""
    return bound is None or in_flight + 1 <= bound


@dataclass(frozen=True)
class LearnerParams:
    """What the learner published: its version and admission parameters (None: unknown,
    i.e. no learner has published them yet)."""

    version: int = 0
    max_staleness: int | None = None
    groups_per_step: int | None = None
    training: int = 0
    finished: str = ""
    """Why the learner stopped taking groups (its goal was met); empty: it takes them."""

    @property
    def known(self) -> bool:
        return self.groups_per_step is not None

    @classmethod
    def from_hash(cls, raw: Mapping[bytes | str, bytes | str]) -> LearnerParams:
        """From ``HGETALL Keys.learner_state`` (bytes or str; missing fields: unknown)."""
        d = {(k.decode() if isinstance(k, bytes) else k):
             (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()}

        def num(name: str) -> int | None:
            try:
                return int(float(d[name]))
            except (KeyError, ValueError):
                return None

        stale = num(FIELD_MAX_STALENESS)
        return cls(version=num(FIELD_VERSION) or 0,
                   max_staleness=None if stale is None or stale < 0 else stale,
                   groups_per_step=num(FIELD_GROUPS_PER_STEP),
                   training=max(0, num(FIELD_TRAINING) or 0),
                   finished=d.get(FIELD_FINISHED, ""))

    def bound(self, server_version: int, fallback: int | None) -> int | None:
        """The capacity for a server at ``server_version``; ``fallback`` while no learner has
        published its parameters."""
        if not self.known:
            return fallback
        assert self.groups_per_step is not None
        return capacity(self.max_staleness, self.groups_per_step,
                        self.version - server_version)


IN_FLIGHT_FACTS = """
-- KEYS: deadlines, complete, ready stream, learner state, admission servers
-- ARGV: the pending keys' prefix, the reading server's id ('' : none), the learner's
--       consumer group
-- -> {open, complete, stream length, the group's lag (-1: unknown), other servers' pending,
--     the learner state's HGETALL}; servers whose pending key expired leave the set
local n_open = redis.call('ZCARD', KEYS[1])
local n_complete = redis.call('SCARD', KEYS[2])
local depth = redis.call('XLEN', KEYS[3])
local lag = -1
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[3])  -- no stream yet: an error
if ok then
  for _, g in ipairs(groups) do
    local name, glag = nil, false
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'lag' then glag = g[i + 1] end
    end
    if name == ARGV[3] then
      if glag then lag = glag end  -- a nil lag: Redis cannot say, the stream's length counts
      break
    end
  end
end
local remote = 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[5])) do
  if id ~= ARGV[2] then
    local v = redis.call('GET', ARGV[1] .. id)
    if v then remote = remote + tonumber(v) else redis.call('SREM', KEYS[5], id) end
  end
end
return {n_open, n_complete, depth, lag, remote, redis.call('HGETALL', KEYS[4])}
"""
"""The facts the in-flight count is made of, in one round trip (``gspo_rl.server.inflight`` reads it
for the gate, ``gspo_rl.learner.target`` to drain); ``in_flight_call`` gives its keys and arguments,
``InFlightFacts.from_reply`` reads its reply."""


def in_flight_call(keys: Keys, server_id: str = "") -> tuple[list[str], list[str]]:
    """KEYS and ARGV of ``IN_FLIGHT_FACTS`` for server ``server_id`` (its own pending count is
    left out: its gate knows it exactly; "": every server's counts)."""
    return ([keys.deadlines, keys.complete, keys.ready_stream, keys.learner_state,
             keys.admission_servers],
            [keys.admission_pending(""), server_id, LEARNER_CONSUMER_GROUP])


@dataclass(frozen=True)
class InFlightFacts:
    """One reply of ``IN_FLIGHT_FACTS``. ``undelivered``: published groups the learner has
    not read, its consumer group's lag on the ready stream (the stream's length when there is
    no such group or Redis cannot say)."""

    open: int
    complete: int
    undelivered: int
    remote_pending: int
    ready_depth: int
    learner: LearnerParams

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> InFlightFacts:
        n_open, n_complete, depth, lag, remote, state = reply
        depth, lag = int(depth), int(lag)
        return cls(open=int(n_open), complete=int(n_complete),
                   undelivered=depth if lag < 0 else lag, remote_pending=int(remote),
                   ready_depth=depth,
                   learner=LearnerParams.from_hash(dict(zip(state[::2], state[1::2],
                                                            strict=True))))
