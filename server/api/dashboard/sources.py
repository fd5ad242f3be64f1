"""The dashboard's reads of Redis, each shaped into its wire model (``protocol``).

``read_sources`` fetches what ``GET /v1/dashboard/state`` shows in one pipelined round trip
(the learner's state hash, the counters, the finished-rewards totals, the registry, the newest
evaluations) and one more for the registry's heartbeat keys; every read is bounded
(``MAX_SERVERS`` servers, ``N_EVALS`` evaluations). The shaping functions are pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from gspo_rl.contract.schema import (
    REWARD_TRAINED,
    REWARD_TRAINED_RECENT,
    REWARD_TRAINED_STEPS,
    Keys,
    as_str,
)
from gspo_rl.contract.stall import LastStall
from gspo_rl.redisq.evals import decode_entries
from gspo_rl.redisq.registry import parse_registration
from gspo_rl.server.api.dashboard.protocol import (
    DashboardEval,
    FatesOut,
    LoadOut,
    ServerOut,
    StallOut,
    WeightSyncOut,
)

MAX_SERVERS = 64
N_EVALS = 10
MAX_EVAL_METRICS = 8
HEARTBEAT_TTL_S = 10.0
"""The registry heartbeat's time to live (``heartbeat_loop``'s ``ttl_s``, which the server
uses): its age is this minus the key's remaining time to live."""


@dataclass
class Sources:
    learner: dict[str, str]
    counters: dict[str, int]
    finished: dict[str, str]
    servers: dict[str, bytes]
    heartbeats_ms: dict[str, int]
    evals: list[tuple[str, dict[str, Any]]]


def _text(raw: dict[Any, Any]) -> dict[str, str]:
    return {as_str(k): v.decode(errors="replace") if isinstance(v, bytes) else str(v)
            for k, v in raw.items()}


def as_int(v: Any) -> int:
    try:
        return int(float(v))
    except (TypeError, ValueError, OverflowError):
        return 0


def as_float(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) else 0.0


async def read_sources(redis: Redis, keys: Keys) -> Sources:
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.learner_state)
        pipe.hgetall(keys.counters)
        pipe.hgetall(keys.finished_rewards)
        pipe.hgetall(keys.servers)
        pipe.xrevrange(keys.eval_stream, count=N_EVALS)
        learner, counters, finished, servers, evals = await pipe.execute()
    ids = sorted(as_str(k) for k in servers)[:MAX_SERVERS]
    registry = {sid: servers.get(sid.encode(), b"") for sid in ids}
    ttls: list[int] = []
    if ids:
        async with redis.pipeline(transaction=False) as pipe:
            for sid in ids:
                pipe.pttl(keys.server_alive(sid))
            ttls = await pipe.execute()
    return Sources(learner=_text(learner),
                   counters={k: as_int(v) for k, v in _text(counters).items()},
                   finished=_text(finished), servers=registry,
                   heartbeats_ms=dict(zip(ids, (int(t) for t in ttls), strict=True)),
                   evals=decode_entries(evals))


def servers_out(src: Sources, admin_key: str | None, this_id: str) -> list[ServerOut]:
    """The registry's servers (``gspo_rl.redisq.registry``), verified with this
    server's admin key, with the load and weight update each reported at its last heartbeat;
    an entry that does not parse or verify is shown with why."""
    out = []
    for sid, raw in src.servers.items():
        ttl_ms = src.heartbeats_ms.get(sid, -2)
        age = None if ttl_ms < 0 else max(0.0, round(HEARTBEAT_TTL_S - ttl_ms / 1000, 1))
        problem = None if age is not None else "no heartbeat (the server stopped or died)"
        try:
            info = parse_registration(raw, admin_key)
        except ValueError as exc:
            out.append(ServerOut(server_id=sid, url="", engine="", model="",
                                 policy_version=-1, heartbeat_age_s=age, verified=False,
                                 problem=str(exc)[:200], this=sid == this_id))
            continue
        load, sync = info.load, info.weight_sync
        out.append(ServerOut(
            server_id=sid, url=info.url, engine=info.engine, model=info.model,
            policy_version=info.policy_version, heartbeat_age_s=age, verified=True,
            load=None if load is None else LoadOut(running=load.running, waiting=load.waiting),
            weight_sync=None if sync is None else WeightSyncOut(**sync.model_dump()),
            problem=problem, this=sid == this_id))
    return out


def fates_out(src: Sources) -> FatesOut:
    """The fate of every group (as ``gspo_rl.learner.tracking.metrics.group_fates`` reads it): the
    counters, with ``trained`` and ``tokens_trained`` from the learner's state."""
    c = src.counters
    generated, tokens = c.get("groups_created", 0), c.get("tokens_generated", 0)
    trained = as_int(src.learner.get("groups_trained", 0))
    tokens_trained = as_int(src.learner.get("tokens_trained", 0))
    dropped = {k.removeprefix("groups_"): v for k, v in sorted(c.items()) if "dropped" in k}
    return FatesOut(
        generated=generated, published=c.get("groups_published", 0), trained=trained,
        dropped=dropped, in_flight=max(0, generated - trained - sum(dropped.values())),
        tokens_generated=tokens, tokens_trained=tokens_trained,
        trained_group_fraction=trained / generated if generated else None,
        trained_token_fraction=tokens_trained / tokens if tokens else None)


def finished_totals(src: Sources) -> tuple[int, int, float]:
    """(groups, rewards, sum) of ``Keys.finished_rewards``."""
    f = src.finished
    return as_int(f.get("groups", 0)), as_int(f.get("rewards", 0)), as_float(f.get("sum", 0.0))


def optional_float(v: str | None) -> float | None:
    """A hash field's finite float; None when absent, empty or not a finite number."""
    try:
        x = float(v) if v else math.nan
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def trained_rewards(src: Sources) -> dict[str, Any]:
    """``RewardSummary``'s trained fields, from the learner's state hash."""
    lr = src.learner
    return {"trained_last_mean": optional_float(lr.get(REWARD_TRAINED)),
            "trained_recent_mean": optional_float(lr.get(REWARD_TRAINED_RECENT)),
            "trained_recent_steps": as_int(lr.get(REWARD_TRAINED_STEPS, 0))}


def stall_out(src: Sources) -> StallOut | None:
    stall = LastStall.from_hash(src.learner)
    return None if stall is None else StallOut(
        reason=stall.reason, detail=stall.detail, at=stall.at, for_s=stall.for_s,
        ended_at=stall.ended_at)


def evals_out(src: Sources) -> list[DashboardEval]:
    """The newest evaluations first, a few of their finite numeric metrics each."""
    out = []
    for _, rec in src.evals:
        metrics = rec.get("metrics")
        if not isinstance(metrics, dict):
            continue
        nums = {str(k)[:64]: float(v) for k, v in metrics.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
                and math.isfinite(v)}
        out.append(DashboardEval(name=str(rec.get("name", ""))[:64],
                           policy_version=as_int(rec.get("policy_version", -1)),
                           time=as_float(rec.get("time", 0.0)),
                           metrics=dict(list(nums.items())[:MAX_EVAL_METRICS])))
    return out
