"""How many groups are in flight, derived from facts in Redis (no counter that could drift).

A group is in flight (``contract.admission``) from its admission until it is trained or
leaves. Each stage of its life is something Redis already holds, so the count is their sum,
read in one pipelined round trip (plus one ``MGET`` for the other servers):

- admitted by a server whose request is still being served (sampling; the group may not be
  in Redis yet): every server publishes its count to ``Keys.admission_pending(id)`` every
  ``PUBLISH_EVERY_S`` with a TTL of ``PENDING_TTL_S``; a server that crashed stops counting
  once its key expires;
- open, waiting for rewards: the deadlines sorted set (``Keys.deadlines``); an abandoned
  group counts until it expires;
- complete, being published: ``Keys.complete``;
- published, not yet delivered to the learner: the learner consumer group's ``lag`` on the
  ready stream (its length when no learner has created the group yet);
- delivered, being trained: the learner's ``training`` field (``Keys.learner_state``), set in
  the same Lua script that takes the groups from the stream (``learner.reader_scripts``), so
  a group leaves the lag and joins ``training`` in one step.

Trained groups waiting for their checkpoint (pending in the stream) are not in flight, nor
are dropped (equal rewards, stale, invalid) or expired ones: they are in none of these.
After a restart of anything the count is right again at the next read: a restarted learner
publishes ``training`` 0, a dead server's pending key expires, and groups redelivered to a
restarted learner (pending, trained before its last checkpoint died) are not counted: for
one batch the count is low by at most the groups it retrains.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from contract.admission import LearnerParams, undelivered
from contract.redis_schema import Keys, as_str

log = logging.getLogger(__name__)
PUBLISH_EVERY_S = 1.0
PENDING_TTL_S = 5


@dataclass(frozen=True)
class Snapshot:
    """One read of the in-flight facts. ``others``: everything but this server's own
    pending requests (which the gate knows exactly)."""

    open: int
    complete: int
    undelivered: int
    remote_pending: int
    ready_depth: int
    learner: LearnerParams

    @property
    def others(self) -> int:
        return (self.open + self.complete + self.undelivered + self.learner.training
                + self.remote_pending)


class InFlightCounter:
    """Reads the global facts; publishes this server's pending count."""

    def __init__(self, client: aioredis.Redis, keys: Keys, server_id: str) -> None:
        self.client = client
        self.keys = keys
        self.server_id = server_id

    async def read(self) -> Snapshot:
        k = self.keys
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zcard(k.deadlines).scard(k.complete).xlen(k.ready_stream)
            pipe.xinfo_groups(k.ready_stream).hgetall(k.learner_state)
            pipe.smembers(k.admission_servers)
            n_open, n_complete, depth, groups, learner, servers = await pipe.execute(
                raise_on_error=False)
        for v in (n_open, n_complete, depth, learner, servers):
            if isinstance(v, Exception):
                raise v
        others = sorted(as_str(s) for s in servers if as_str(s) != self.server_id)
        remote = 0
        if others:
            values = await self.client.mget([k.admission_pending(s) for s in others])
            gone = [s for s, v in zip(others, values, strict=True) if v is None]
            remote = sum(int(v) for v in values if v is not None)
            if gone:  # expired: that server stopped (or crashed)
                await self.client.srem(k.admission_servers, *gone)
        return Snapshot(open=int(n_open), complete=int(n_complete),
                        undelivered=undelivered(groups, int(depth)), remote_pending=remote,
                        ready_depth=int(depth), learner=LearnerParams.from_hash(learner))

    async def publish(self, pending: int) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.admission_pending(self.server_id), pending, ex=PENDING_TTL_S)
            pipe.sadd(self.keys.admission_servers, self.server_id)
            await pipe.execute()

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
            await self.client.delete(self.keys.admission_pending(self.server_id))
