"""The asyncio redis-py client the server's store and its helpers use (``make_redis``).

Retries briefly on connection errors (Redis restarting): every store operation is idempotent,
so a retried script that had already run is harmless. Replies stay bytes
(``decode_responses=False``), as ``gspo_rl.redisq.groups.store.RolloutStore`` requires.
"""

from __future__ import annotations

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff


def make_redis(url: str, max_connections: int = 256) -> aioredis.Redis:
    """An asyncio client for ``url`` with the store's retries and timeouts."""
    return aioredis.Redis.from_url(
        url, decode_responses=False, max_connections=max_connections,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), retries=5),
        retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
        socket_connect_timeout=2.0, socket_timeout=10.0, health_check_interval=10,
    )
