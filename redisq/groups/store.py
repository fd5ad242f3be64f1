"""A group's life in Redis: created, rollouts recorded, rewarded, completed, published once.

``RolloutStore`` holds every operation on groups and rollouts: ``record_group`` (a group the
sampling path sampled whole, one MULTI/EXEC), ``create_group`` and ``record_rollouts`` (the
episodes' path), ``post_rewards`` (all or nothing; the reward that completes a group publishes
or drops it in the same script when the Lua credit rule covers it, else the Python rule runs
and ``PUBLISH_GROUP`` follows), ``sweep_once`` / ``run_sweeper`` (deadlines, and groups left
``complete`` by a crash) and the reads. A group leaves ``open`` only through the reward script
and is published only atomically with the state change that ends it, so it is published at
most once, crash or not. Requires a client with ``decode_responses=False``. The design and its
measurements: docs/design/redis-protocol.md."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import msgpack
import redis.asyncio as aioredis
import redis.exceptions
from redis.commands.core import AsyncScript

from gspo_rl.contract.errors import StoreError, StoreReason
from gspo_rl.contract.schema import (
    READY_COUNT_FIELD,
    READY_HEAD_FIELD,
    READY_RECORDS_FIELD,
    Keys,
    RolloutRecord,
    as_str,
    key_template,
    member_rollout_id,
    pack_rollout,
)
from gspo_rl.redisq.connection import RedisPipe, pipe_for, run_script
from gspo_rl.redisq.errors import item_status, record_error
from gspo_rl.redisq.groups.finish import (
    Snapshot,
    decide_finish,
    publish_call,
    publish_result,
    read_snapshot,
)
from gspo_rl.redisq.groups.reads import read_group
from gspo_rl.redisq.groups.rewards import POST_REWARDS, PUBLISH_GROUP
from gspo_rl.redisq.groups.scripts import (
    ABANDON_GROUP,
    CREATE_GROUP,
    EXPIRE_DUE,
    RECORD_NEW_GROUP,
    RECORD_ROLLOUTS,
)
from gspo_rl.redisq.groups.types import (
    GroupView,
    QueueConfig,
    RewardItem,
    RewardResult,
    RewardsOutcome,
    pack_reward,
    pack_rewards,
)
from gspo_rl.redisq.lua import LuaScript, template_args
from gspo_rl.redisq.ready.entry import pack_group_records
from gspo_rl.redisq.tasks import GroupOutcome, record_outcomes, snapshot_outcome

__all__ = ["GroupView", "QueueConfig", "RewardItem", "RewardResult", "RewardsOutcome",
           "RolloutStore", "StoreError", "pack_reward"]

logger = logging.getLogger(__name__)

class RolloutStore:
    """Every operation on groups and rollouts in Redis (see the module docstring)."""

    def __init__(
        self, redis: aioredis.Redis, keys: Keys = Keys(), config: QueueConfig = QueueConfig()
    ) -> None:
        if redis.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("RolloutStore needs a Redis client with decode_responses=False")
        self.redis = redis
        self.keys = keys
        self.config = config
        self._create = redis.register_script(CREATE_GROUP.source)
        self._record = redis.register_script(RECORD_ROLLOUTS.source)
        self._record_new = redis.register_script(RECORD_NEW_GROUP.source)
        self._rewards = redis.register_script(POST_REWARDS.source)
        self._expire = redis.register_script(EXPIRE_DUE.source)
        self._abandon = redis.register_script(ABANDON_GROUP.source)
        self._publish = redis.register_script(PUBLISH_GROUP.source)
        self._pipe = pipe_for(redis)
        k = keys
        self._t_rollout, self._t_map = key_template(k.rollout), key_template(k.rollout_group)
        self._t_group, self._t_list = key_template(k.group), key_template(k.group_rollouts)
        self._t_rewards = key_template(k.group_rewards)
        self._t_staging = key_template(k.rollout_staging)
        self._t_blob = key_template(k.group_records)
        self._finished_ttl = max(1, math.ceil(config.finished_ttl_s))
        self._records_ttl = min(self._finished_ttl, math.ceil(config.dropped_records_ttl_s))
        adv = config.advantage
        # the constant arguments of the hot scripts, encoded once
        self._reward_args = POST_REWARDS.constants(
            **template_args("m", self._t_map), **template_args("g", self._t_group),
            **template_args("w", self._t_rewards), **template_args("l", self._t_list),
            **template_args("r", self._t_rollout), inline=1, eps=repr(float(adv.eps)),
            scale=int(adv.scale), drop_zero_variance=int(config.drop_zero_variance),
            advantage_config=msgpack.packb(adv.to_dict()), finished_ttl=self._finished_ttl,
            records_ttl=self._records_ttl,
            idle_s=config.group_idle_s, head_field=READY_HEAD_FIELD, ids_field=READY_COUNT_FIELD,
            **template_args("b", self._t_blob), records_field=READY_RECORDS_FIELD)
        # a record's TTL from its last write, never less than its group's keys
        self._record_ttl = max(math.ceil(config.rollout_ttl_s),
                               math.ceil(config.group_ttl_s + self._finished_ttl) + 1)
        self._record_args = RECORD_ROLLOUTS.constants(
            record_ttl=self._record_ttl, **template_args("r", self._t_rollout),
            **template_args("m", self._t_map), **template_args("s", self._t_staging),
            idle_s=config.group_idle_s)
        self._new_group_args = RECORD_NEW_GROUP.constants(
            record_ttl=self._record_ttl, **template_args("m", self._t_map))

    @property
    def pipe(self) -> RedisPipe | None:
        """The store's own connection (None: redis-py's, for a TLS or socket client); other
        readers of the hot path may share it (``gspo_rl.redisq.inflight``)."""
        return self._pipe

    async def aclose(self) -> None:
        """Closes the store's own connection (the hot path's ``RedisPipe``); the redis-py
        client passed in stays the caller's to close."""
        if self._pipe is not None:
            await self._pipe.aclose()

    async def _run(self, script: AsyncScript, slots: tuple[list[Any], list[Any]],
                   before: Sequence[tuple[Any, ...]] = ()) -> Any:
        """Runs ``script`` with ``slots`` (``LuaScript.slots``: its KEYS and ARGV)."""
        return await run_script(self._pipe, self.redis, script, *slots, before)

    def _check_size(self, size: int) -> None:
        if not 1 <= size <= self.config.max_group_size:
            raise StoreError(StoreReason.INVALID, "invalid_group_size",
                             f"group size must be in [1, {self.config.max_group_size}]")

    async def create_group(
        self, group_id: str, size: int, metadata: dict[str, Any] | None = None
    ) -> None:
        """Opens a group of ``size`` rollouts. Idempotent for the same size (a retried
        request); ``StoreError`` (conflict) if the id exists with another size."""
        self._check_size(size)
        res = await self._run(self._create, CREATE_GROUP.slots(
            keys={"group_key": self.keys.group(group_id), "deadlines_key": self.keys.deadlines,
                  "active_key": self.keys.group_activity, "counters_key": self.keys.counters},
            args={"group_id": group_id, "size": size, "metadata": msgpack.packb(metadata or {}),
                  "group_ttl": self.config.group_ttl_s, "finished_ttl": self._finished_ttl,
                  "idle_s": self.config.group_idle_s}))
        if int(res) < 0:
            raise StoreError(StoreReason.CONFLICT, "group_exists",
                             f"group {group_id!r} exists with another size")

    async def record_group(self, group_id: str, size: int, metadata: dict[str, Any] | None,
                           records: Sequence[RolloutRecord]) -> None:
        """Opens group ``group_id`` with ``size`` rollouts and records ``records`` in it, in one
        round trip (one MULTI/EXEC): how the sampling path stores a group it has just sampled.
        The group id and the rollout ids must be new, minted for this call (the sampling
        path's: a uuid4 group id, rollout ids that name it): the records are written as one
        value, the group's records key (``pack_group_records``; ``RECORD_NEW_GROUP``),
        without the staging and the checks that ids already in use need
        (``record_rollouts``); the group takes no rollouts one by one afterwards. Ids of the
        form ``member_rollout_id(group_id, i)`` (what the sampling path mints) name their
        group: no rollout -> group key is written for them.
        Idempotent when retried with the same records; ``StoreError`` ``group_exists`` (and
        nothing recorded) if the group id is already in use."""
        self._check_size(size)
        if any(r.group_id != group_id for r in records):
            raise ValueError("every record must belong to the group")
        ids = [r.rollout_id for r in records]
        if len(set(ids)) != len(ids):
            raise ValueError("rollout ids must be distinct")
        if len(ids) > size:
            raise StoreError(StoreReason.CONFLICT, "group_full",
                             f"{len(ids)} rollouts for a group of {size}")
        k, c = self.keys, self.config
        # ids that name their group (the sampling path's) need no rollout -> group keys
        members = all(rid == member_rollout_id(group_id, i) for i, rid in enumerate(ids))
        slots = RECORD_NEW_GROUP.slots(
            keys={"group_key": k.group(group_id), "rollouts_key": k.group_rollouts(group_id),
                  "deadlines_key": k.deadlines, "active_key": k.group_activity,
                  "counters_key": k.counters, "records_key": k.group_records(group_id)},
            args={"group_id": group_id, "size": size, "metadata": msgpack.packb(metadata or {}),
                  "group_ttl": c.group_ttl_s, "finished_ttl": self._finished_ttl,
                  "idle_s": c.group_idle_s, "members": int(members),
                  "sampled": sum(int(r.loss_mask.sum()) for r in records)},
            constants=self._new_group_args, rest=ids)
        # NX: a group id in use keeps its records (the script then deletes nothing of theirs)
        writes = [("SET", k.group_records(group_id), pack_group_records(records), "EX",
                   self._record_ttl, "NX")] if records else []
        res = await self._run(self._record_new, slots, before=writes)
        if records and (err := record_error(as_str(res), records[0])) is not None:
            raise err

    async def record_rollout(self, record: RolloutRecord) -> None:
        """Stores the rollout and appends its id to its group's list (once: recording the same
        rollout again replaces its record, e.g. a multi-turn episode that grew)."""
        await self.record_rollouts([record])

    async def record_rollouts(self, records: Sequence[RolloutRecord]) -> None:
        """``record_rollout`` for several rollouts: one MULTI/EXEC per group (plain SETs of the
        records to staging keys, then the record script, which renames the accepted ones into
        place). Raises the first refusal; the other rollouts are recorded (recording is
        idempotent, so a retry is safe)."""
        by_group: dict[str, list[RolloutRecord]] = {}
        for rec in records:
            by_group.setdefault(rec.group_id, []).append(rec)
        first_error: StoreError | None = None
        for gid, recs in by_group.items():
            results = await self._record_group(gid, recs)
            for rec, res in zip(recs, results, strict=True):
                first_error = first_error or record_error(as_str(res), rec)
        if first_error is not None:
            raise first_error

    async def _record_group(self, gid: str, recs: list[RolloutRecord]) -> list[Any]:
        k = self.keys
        slots = RECORD_ROLLOUTS.slots(
            keys={"group_key": k.group(gid), "rollouts_key": k.group_rollouts(gid),
                  "rewards_key": k.group_rewards(gid), "active_key": k.group_activity},
            args={"group_id": gid}, constants=self._record_args,
            rest=[r.rollout_id for r in recs])
        # with the record's TTL, which RENAME keeps (a staging key the script never saw, when
        # the transaction failed, expires on its own)
        staged = [("SET", k.rollout_staging(r.rollout_id), pack_rollout(r), "EX",
                   self._record_ttl) for r in recs]
        return list(await self._run(self._record, slots, before=staged))

    async def post_rewards(self, items: Sequence[RewardItem]) -> RewardsOutcome:
        """Records rewards, all or nothing (one script checks every item, then writes them);
        the same script publishes (or drops) the groups they completed, unless a group needs
        the Python credit rule (turn rewards), which then runs here, followed by the publish
        script. See ``server/api/routes/rewards.py``."""
        packed, in_call_conflict = pack_rewards(items)
        if in_call_conflict:
            return RewardsOutcome([
                RewardResult(it.rollout_id,
                             "conflict" if it.rollout_id in in_call_conflict else "not_applied")
                for it in items], applied=False)
        pairs: list[Any] = []
        for rid, p in packed.items():
            pairs += [rid, p]
        k = self.keys
        statuses, gids, completed = await self._run(self._rewards, POST_REWARDS.slots(
            keys={"counters_key": k.counters, "complete_key": k.complete,
                  "deadlines_key": k.deadlines, "stream_key": k.ready_stream,
                  "finished_key": k.finished_rewards, "active_key": k.group_activity},
            args={"n_pairs": len(packed)}, constants=self._reward_args, rest=pairs))
        by_rid = {rid: (as_str(st), as_str(g) or None)
                  for rid, st, g in zip(packed, statuses, gids, strict=True)}
        done = {as_str(c[0]) for c in completed}
        applied = all(st in ("ok", "duplicate") for st, _ in by_rid.values())
        results = []
        for it in items:
            st, gid = by_rid[it.rollout_id]
            results.append(RewardResult(it.rollout_id, item_status(st, applied), gid,
                                        applied and gid in done))
        ended: list[GroupOutcome] = []
        for c in completed:  # groups the script left for the Python rule (turn rewards)
            if as_str(c[1]) == "complete":
                snap = Snapshot.from_script(c[2], c[3], c[4])
                fate = await self._finish_safely(as_str(c[0]), snap)
                if fate is not None:
                    ended.append(snapshot_outcome(as_str(c[0]), fate, snap))
            else:  # ended by the script: {gid, fate, stream id or reason, metadata, rewards}
                ended.append(GroupOutcome(as_str(c[0]), as_str(c[1]), as_str(c[2]), c[3] or None,
                                          [float(x) for x in msgpack.unpackb(c[4])]))
        await record_outcomes(self.redis, self.keys, ended, time.time())
        return RewardsOutcome(results, applied)

    async def _finish_safely(self, group_id: str, snapshot: Snapshot | None) -> str | None:
        """Publishes a group whose rewards are stored (returns ``finish_group``'s result); on
        a Redis error the group stays in the ``complete`` set for the sweeper: the rewards are
        safe, so the caller still gets 2xx."""
        try:
            return await self.finish_group(group_id, snapshot)
        except redis.exceptions.RedisError as e:  # unreachable, out of memory, ...
            logger.warning("publishing group %s deferred to the sweeper: %s", group_id, e)
            return None

    async def finish_group(self, group_id: str, snapshot: Snapshot | None = None) -> str | None:
        """Computes advantages and publishes (or drops) a ``complete`` group; returns the
        stream id, 'dropped', or None if the group was not complete (already handled).
        ``snapshot``: the group as the reward script that completed it returned it (saves
        reading it back); without it, it is read from Redis."""
        if snapshot is None:
            snapshot = await read_snapshot(self.redis, self.keys, group_id)
            if snapshot is None:
                return None
        decision = decide_finish(self.config, group_id, snapshot)
        res = await self._run(self._publish, publish_call(self.keys, group_id, decision,
                                                          self._finished_ttl,
                                                          self._records_ttl))
        return publish_result(res)

    def _end_open_slots(self, script: LuaScript, **last: Any) -> tuple[list[Any], list[Any]]:
        """KEYS and ARGV of ``EXPIRE_DUE`` / ``ABANDON_GROUP`` (``last``: their own argument)."""
        k = self.keys
        return script.slots(
            keys={"deadlines_key": k.deadlines, "active_key": k.group_activity,
                  "complete_key": k.complete, "counters_key": k.counters},
            args={**template_args("g", self._t_group), **template_args("l", self._t_list),
                  **template_args("w", self._t_rewards), **template_args("r", self._t_rollout),
                  **template_args("m", self._t_map),
                  "min_rewarded": self.config.min_rewarded_to_finalise,
                  "finished_ttl": self._finished_ttl, **template_args("b", self._t_blob),
                  "records_ttl": self._records_ttl, **last})

    async def abandon_group(self, group_id: str) -> str | None:
        """Ends an open group now, as its deadline would (``ABANDON_GROUP``): published with
        its rewards when it has ``min_rewarded_to_finalise`` of them (partial), else dropped
        (state ``expired``, drop_reason ``abandoned``); either way it stops counting as in
        flight at once. Returns the group's state after (an ended group's as it was: calling
        again is harmless); None for an unknown group."""
        keys, args = self._end_open_slots(ABANDON_GROUP, group_id=group_id)
        state = as_str(await self._abandon(keys=keys, args=args))
        if state == "gone":
            return None
        if state == "complete":
            await self._finish_safely(group_id, None)
            view = await self.get_group(group_id)
            return view.state if view is not None else state
        return state

    async def sweep_once(self) -> dict[str, int]:
        """One pass: expires due groups (publishing those with enough rewards) and publishes
        groups left ``complete`` longer than ``stuck_complete_s``. Returns what it did."""
        c, k = self.config, self.keys
        keys, args = self._end_open_slots(EXPIRE_DUE, limit=c.sweep_limit)
        due = await self._expire(keys=keys, args=args)
        done = {"expired_finalised": len(due), "stuck_published": 0}
        for gid in due:
            await self.finish_group(as_str(gid))
        secs, micros = await self.redis.time()
        now = secs + micros / 1e6
        async for raw in self.redis.sscan_iter(k.complete, count=500):
            gid = as_str(raw)
            completed_at = await self.redis.hget(k.group(gid), "completed_at")
            if completed_at is None:
                await self.redis.srem(k.complete, gid)  # its keys expired: nothing to publish
            elif now - float(completed_at) >= c.stuck_complete_s:
                done["stuck_published"] += await self.finish_group(gid) is not None
        return done

    async def run_sweeper(self, interval_s: float = 1.0) -> None:
        """Background task: ``sweep_once`` every ``interval_s`` until cancelled. Redis errors
        are logged and retried next pass (the server stays up while Redis restarts)."""
        task = asyncio.current_task()
        while True:
            try:
                await self.sweep_once()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
                logger.warning("sweeper: redis unavailable: %s", e)
            except redis.exceptions.ResponseError as e:
                logger.error("sweeper: redis error: %s", e)
            # A cancel that lands while a Redis call times out can surface as a TimeoutError
            # (asyncio.timeout's race), caught above: honour it instead of sweeping forever.
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            await asyncio.sleep(interval_s)

    async def get_group(self, group_id: str) -> GroupView | None:
        return await read_group(self.redis, self.keys, group_id)

    async def counters(self) -> dict[str, int]:
        raw = await self.redis.hgetall(self.keys.counters)
        return {as_str(a): int(b) for a, b in raw.items()}
