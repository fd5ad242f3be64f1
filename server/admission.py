"""A bound on the ready queue: no new groups while the learner is far behind.

The ready queue is the Redis stream of published groups (``Keys.ready_stream``); the learner
reads it, acknowledges what it trained or dropped and trims the stream. When the learner stops
(paused, crashed, restarting), groups would pile up without limit: Redis memory grows, and by
the time the learner returns the groups are too stale to train.

Behaviour at the bound (``ServerSettings.max_ready_groups``, 0: no bound): while the stream
holds that many entries or more, requests that would start a *new* group are refused with
503 ``ready_queue_full`` and ``Retry-After`` (``POST /v1/completions``, ``/v1/rollouts``,
``/v1/chat/completions`` without a ``rollout_id``, ``POST /v1/groups``). Work already
accepted is never refused or lost: rewards are stored and their groups published (the stream
may go over the bound by the groups in flight), and turns of open multi-turn episodes go on.
The depth is the gauge ``gspo_ready_queue_depth`` (refreshed by every admission check and
every ``/metrics`` scrape); refusals count in ``gspo_ready_queue_refused``.
"""

from __future__ import annotations

import logging
import time

import redis.asyncio as aioredis
from fastapi import Request

from server.errors import APIError
from server.limits import parsed_body
from server.metrics import ServerMetrics

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5
WARN_EVERY_S = 10.0


class ReadyQueueGate:
    """Reads the ready stream's length and refuses new groups at the bound."""

    def __init__(self, client: aioredis.Redis, stream_key: str, max_ready_groups: int,
                 metrics: ServerMetrics) -> None:
        self.client = client
        self.stream_key = stream_key
        self.max_ready_groups = max_ready_groups
        self.metrics = metrics
        self._last_warning = -WARN_EVERY_S

    async def depth(self) -> int:
        """Entries on the ready stream (published, not yet acknowledged and trimmed)."""
        depth = int(await self.client.xlen(self.stream_key))
        self.metrics.ready_queue_depth.set(depth)
        return depth

    async def admit(self, route: str) -> None:
        """503 while the stream is at or over the bound (one XLEN, O(1) in Redis)."""
        if self.max_ready_groups <= 0:
            return
        depth = await self.depth()
        if depth < self.max_ready_groups:
            return
        self.metrics.ready_queue_refused.labels(route).inc()
        now = time.monotonic()
        if now - self._last_warning < WARN_EVERY_S:  # every request is refused: log sparsely
            raise self._full(depth)
        self._last_warning = now
        log.warning("ready queue holds %d groups (bound %d): refusing new groups on %s until "
                    "the learner catches up", depth, self.max_ready_groups, route)
        raise self._full(depth)

    def _full(self, depth: int) -> APIError:
        return APIError(503, f"the ready queue holds {depth} groups, at this server's bound of "
                             f"{self.max_ready_groups} (max_ready_groups): the learner is "
                             "behind; retry later", code="ready_queue_full",
                        headers={"Retry-After": str(RETRY_AFTER_S)})


async def admit_new_group(request: Request) -> None:
    """Dependency of the routes that start a group (see the module docstring). A chat request
    carrying a ``rollout_id`` continues an accepted episode and is let through."""
    gate: ReadyQueueGate | None = getattr(request.app.state, "ready_gate", None)
    if gate is None:
        return
    if request.url.path == "/v1/chat/completions":
        body = await parsed_body(request)
        if isinstance(body, dict) and body.get("rollout_id") is not None:
            return
    await gate.admit(request.url.path)
