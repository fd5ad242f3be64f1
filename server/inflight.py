"""How many groups are in flight, derived from facts in Redis (no counter that could drift).

A group is in flight (``gspo_rl.contract.admission``) from its admission until it is trained or
leaves. Each stage of its life is something Redis already holds, so the count is their sum,
read in one round trip (one Lua script, below):

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
  the same Lua script that takes the groups from the stream (``gspo_rl.learner.reader_scripts``), so
  a group leaves the lag and joins ``training`` in one step.

Trained groups waiting for their checkpoint (pending in the stream) are not in flight, nor
are dropped (equal rewards, stale, invalid) or expired ones: they are in none of these.
After a restart of anything the count is right again at the next read: a restarted learner
publishes ``training`` 0, a dead server's pending key expires, and groups redelivered to a
restarted learner (pending, trained before its last checkpoint died) are not counted: for
one batch the count is low by at most the groups it retrains.

A read is one Lua script (``gspo_rl.contract.admission.IN_FLIGHT_FACTS``, the learner drains with it
too) in one round trip, through the store's connection (``gspo_rl.server.redis_pipe``) when the
server has one: the gate reads up to 20 times a second, and the same facts read as six pipelined
commands through redis-py (``XINFO GROUPS`` parsed into dicts) cost ~0.3 ms of the event loop's
CPU each (``bench_server_cpu.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from gspo_rl.contract.admission import IN_FLIGHT_FACTS, InFlightFacts, in_flight_call
from gspo_rl.contract.redis_schema import Keys
from gspo_rl.server.redis_pipe import RedisPipe, run_script

log = logging.getLogger(__name__)
PUBLISH_EVERY_S = 1.0
PENDING_TTL_S = 5



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
                 pipe: RedisPipe | None = None) -> None:
        """``pipe``: the connection reads go through (the store's); None: ``client``."""
        self.client = client
        self.keys = keys
        self.server_id = server_id
        self.pipe = pipe
        self._facts = client.register_script(IN_FLIGHT_FACTS)
        self._keys, self._args = in_flight_call(keys, server_id)

    async def read(self) -> Snapshot:
        """The facts now, in one round trip (``gspo_rl.contract.admission.IN_FLIGHT_FACTS``)."""
        return Snapshot.from_reply(await run_script(self.pipe, self.client, self._facts,
                                                    self._keys, self._args))

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
