"""Rollout servers announce themselves in Redis; the learner reads who is alive.

Each server writes its ``ServerInfo`` into the ``servers`` hash and refreshes a heartbeat key
with a short TTL. A server that dies stops refreshing; its heartbeat expires within ``ttl_s``
and the learner drops it from the broadcast group at its next push (and prunes the hash entry,
so the hash stays bounded).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis
import redis.asyncio as aredis
from pydantic import BaseModel

from server.redis_schema import Keys

log = logging.getLogger(__name__)


class ServerInfo(BaseModel):
    """What the learner needs to reach a server's control plane."""

    server_id: str
    url: str  # base URL of the HTTP API, e.g. http://10.0.0.5:8000
    engine: str
    model: str
    ranks: int = 1  # ranks this server takes in the weight broadcast group


async def heartbeat_loop(
    client: aredis.Redis, keys: Keys, info: ServerInfo, interval_s: float = 2.0,
    ttl_s: float = 10.0,
) -> None:
    """Register and keep the heartbeat fresh until cancelled; deregister on the way out."""
    payload = info.model_dump_json()
    try:
        while True:
            try:
                async with client.pipeline(transaction=True) as pipe:
                    pipe.hset(keys.servers, info.server_id, payload)
                    pipe.set(keys.server_alive(info.server_id), "1", px=int(ttl_s * 1000))
                    await pipe.execute()
            except (redis.RedisError, OSError) as exc:  # Redis briefly down: keep trying
                log.warning("heartbeat to redis failed: %s", exc)
            await asyncio.sleep(interval_s)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_deregister(client, keys, info.server_id), timeout=2.0)


async def _deregister(client: aredis.Redis, keys: Keys, server_id: str) -> None:
    async with client.pipeline(transaction=True) as pipe:
        pipe.hdel(keys.servers, server_id)
        pipe.delete(keys.server_alive(server_id))
        await pipe.execute()


def live_servers(client: redis.Redis, keys: Keys) -> list[ServerInfo]:
    """Servers whose heartbeat is fresh, sorted by id; prunes entries whose heartbeat expired."""
    entries = client.hgetall(keys.servers)
    if not entries:
        return []
    ids = sorted(k.decode() if isinstance(k, bytes) else k for k in entries)
    alive = client.mget([keys.server_alive(i) for i in ids])
    out, dead = [], []
    for sid, flag in zip(ids, alive, strict=True):
        raw = entries.get(sid.encode(), entries.get(sid))
        if flag is None:
            dead.append(sid)
        else:
            out.append(ServerInfo.model_validate_json(raw))
    if dead:
        client.hdel(keys.servers, *dead)
    return out
