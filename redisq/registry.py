"""Rollout servers announce themselves in Redis; the learner reads who is alive.

Each server writes its signed registration into the ``servers`` hash and refreshes a
heartbeat key with a short TTL. A server that dies stops refreshing; its heartbeat expires
within ``ttl_s`` and the learner drops it from the broadcast group at its next push (and
prunes the hash entry, so the hash stays bounded). Each heartbeat also carries the engine's
current policy version, so the learner sees a server that restarted behind it, and what the
dashboard shows of every server: its load (``Load``) and its last weight update
(``WeightSync``); readers that do not know these fields ignore them.

Trust: the learner sends its admin key to every server it pushes to, so whoever can write to
Redis must not be able to point it at their own URL. A registration is
``{"info": <ServerInfo JSON>, "sig": HMAC-SHA256(admin_key, info)}``: the server proves it holds
the admin key without revealing it, and the learner (which holds the same key) accepts only
entries whose signature verifies. Entries that do not parse or verify are skipped and
counted, never fatal. Without an admin key (open admin routes) entries are unsigned and a
learner without a key, which has no secret to leak, accepts them; it does not push to signed
entries (their admin routes would refuse it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, cast

import redis
import redis.asyncio as aredis
from pydantic import BaseModel, ValidationError

from gspo_rl.contract.schema import Keys

log = logging.getLogger(__name__)


class Load(BaseModel):
    """The engine's load at the last heartbeat (``EngineStats``)."""

    running: int = 0  # requests being decoded
    waiting: int = 0  # requests queued


class WeightSync(BaseModel):
    """A server's current or last weight update (``gspo_rl.server.engines.updates``)."""

    version: int  # the version it loads (or loaded, or failed to load)
    state: Literal["receiving", "loaded", "failed"]
    started_at: float  # Unix time, the server's clock
    duration_s: float | None = None  # how long it took (None while receiving)
    error: str | None = None  # why it failed (at most 200 characters)


class ServerInfo(BaseModel):
    """What the learner needs to reach a server's control plane, and the figures the
    dashboard shows of it (``load``, ``weight_sync``: None when not reported)."""

    server_id: str
    url: str  # base URL of the HTTP API, e.g. http://10.0.0.5:8000
    engine: str
    model: str
    ranks: int = 1  # ranks this server takes in the weight broadcast group
    # Random per server process: a restart under the same id is a new broadcast member.
    instance: str = ""
    policy_version: int = -1  # the engine's policy version at the last heartbeat
    load: Load | None = None
    weight_sync: WeightSync | None = None  # None: no update since the server started

    def member(self) -> tuple[str, str, str, int]:
        """What identifies a member of the weight broadcast group (not the version)."""
        return (self.server_id, self.instance, self.url, self.ranks)


def sign(info_json: str, admin_key: str | None) -> str:
    """The registration's signature (empty without a key)."""
    if not admin_key:
        return ""
    return hmac.new(admin_key.encode(), info_json.encode(), hashlib.sha256).hexdigest()


def registration(info: ServerInfo, admin_key: str | None) -> str:
    """The ``servers`` hash value for ``info``."""
    info_json = info.model_dump_json()
    return json.dumps({"info": info_json, "sig": sign(info_json, admin_key)})


def new_instance() -> str:
    return uuid.uuid4().hex[:12]


def _beat(info: ServerInfo, version: Callable[[], int] | None,
          load: Callable[[], Load] | None,
          weight_sync: Callable[[], WeightSync | None] | None) -> ServerInfo:
    """``info`` with this beat's figures (those that cannot be read keep their last value)."""
    update: dict[str, object] = {}
    try:
        if version is not None:
            update["policy_version"] = int(version())
        if load is not None:
            update["load"] = load()
        if weight_sync is not None:
            update["weight_sync"] = weight_sync()
    except Exception as exc:  # a figure, not a reason to stop beating
        log.warning("heartbeat: reading the server's figures failed: %s", exc)
    return info.model_copy(update=update)


async def heartbeat_loop(
    client: aredis.Redis, keys: Keys, info: ServerInfo, interval_s: float = 2.0,
    ttl_s: float = 10.0, *, admin_key: str | None = None,
    version: Callable[[], int] | None = None, load: Callable[[], Load] | None = None,
    weight_sync: Callable[[], WeightSync | None] | None = None,
) -> None:
    """Register and keep the heartbeat fresh until cancelled; deregister on the way out.
    ``version``, ``load`` and ``weight_sync`` read the engine's current policy version, load
    and last weight update for each beat."""
    if not info.instance:
        info = info.model_copy(update={"instance": new_instance()})
    try:
        while True:
            info = _beat(info, version, load, weight_sync)
            try:
                async with client.pipeline(transaction=True) as pipe:
                    pipe.hset(keys.servers, info.server_id, registration(info, admin_key))
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


def register(client: redis.Redis, keys: Keys, info: ServerInfo, admin_key: str | None,
             ttl_s: float = 10.0) -> None:
    """One heartbeat from a synchronous client (tools and tests)."""
    with client.pipeline(transaction=True) as pipe:
        pipe.hset(keys.servers, info.server_id, registration(info, admin_key))
        pipe.set(keys.server_alive(info.server_id), "1", px=int(ttl_s * 1000))
        pipe.execute()


def parse_registration(raw: bytes | str, admin_key: str | None,
                       for_push: bool = False) -> ServerInfo:
    """The ``ServerInfo`` of a hash value; ``ValueError`` if it does not parse or, when the
    learner holds ``admin_key``, its signature does not verify (compared in constant time).
    ``for_push`` without a key also refuses signed entries (their admin routes want one)."""
    try:
        entry = json.loads(raw)
        info_json, sig = entry["info"], entry["sig"]
        if not isinstance(info_json, str) or not isinstance(sig, str):
            raise TypeError("info and sig must be strings")
        info = ServerInfo.model_validate_json(info_json)
    except (ValueError, KeyError, TypeError, ValidationError) as exc:
        raise ValueError(f"malformed registration: {str(exc)[:200]}") from exc
    if admin_key and not hmac.compare_digest(sig, sign(info_json, admin_key)):
        raise ValueError("signature does not verify with this admin key")
    if for_push and not admin_key and sig:  # its admin routes want a key: every call 401s
        raise ValueError("the server requires an admin key and this learner has none "
                         "(set GSPO_ADMIN_KEY)")
    return info


@dataclass
class Registry:
    """One read of the registry: the live, verified servers and the entries skipped."""

    servers: list[ServerInfo] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # server id -> why


_warned: dict[str, float] = {}  # "id: why" -> last warning (one line a minute per entry)


def read_registry(client: redis.Redis, keys: Keys, admin_key: str | None = None,
                  for_push: bool = False) -> Registry:
    """Servers whose heartbeat is fresh and whose entry verifies, sorted by id; prunes entries
    whose heartbeat expired. Entries that do not parse or verify are skipped and reported.
    ``for_push``: only servers the learner can update (see ``parse_registration``)."""
    out = Registry()
    entries = client.hgetall(keys.servers)
    if not entries:
        return out
    ids = sorted(k.decode(errors="replace") if isinstance(k, bytes) else k for k in entries)
    alive = client.mget([keys.server_alive(i) for i in ids])
    dead = []
    for sid, flag in zip(ids, alive, strict=True):
        raw = entries.get(sid.encode(), entries.get(sid))
        if flag is None:
            dead.append(sid)
            continue
        try:
            # (None, a key that does not round-trip: json.loads' TypeError, malformed)
            info = parse_registration(cast("bytes | str", raw), admin_key, for_push)
            if info.server_id != sid:
                raise ValueError(f"registered under {sid!r} but names {info.server_id!r}")
        except ValueError as exc:
            out.rejected[sid] = str(exc)
            now = time.monotonic()
            if len(_warned) > 1000:  # bounded, whatever is written to Redis
                _warned.clear()
            if now - _warned.get(f"{sid}: {exc}", -1e9) > 60.0:
                _warned[f"{sid}: {exc}"] = now
                log.warning("ignoring registry entry %r: %s", sid, exc)
            continue
        out.servers.append(info)
    if dead:
        client.hdel(keys.servers, *dead)
    return out


def live_servers(client: redis.Redis, keys: Keys, admin_key: str | None = None
                 ) -> list[ServerInfo]:
    """The live, verified servers of ``read_registry``."""
    return read_registry(client, keys, admin_key).servers
