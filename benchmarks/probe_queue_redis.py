"""Where the queue's Redis CPU goes, per group of 8 rollouts x 1,024 tokens (BENCHMARKS.md,
"Reward API and Redis queue"): a probe for the next design step, not a goal benchmark.

`flock /work/wt/notes/bench.lock .venv/bin/python benchmarks/probe_queue_redis.py`

One redis-server with the shipped ``docker/redis.conf`` (AOF, everysec); Redis's CPU from
``/proc`` around each part, per group; each variant run ``--rounds`` times, interleaved, and
the median printed (the machine is shared: single runs move by +-30%).

1. The rollout bytes in: the 8 packed records as 8 ``SET ... EX`` (what recording does, less
   the script), as one ``SET`` of their concatenation, and as one ``XADD`` (what the raw
   baseline of ``bench_queue.py`` writes); 32 groups per round trip.
2. Recording a new group: ``record_group`` as it is (MULTI, the 8 records SET straight to their
   keys, ``RECORD_NEW_GROUP``, EXEC), against the staged way it recorded them before (MULTI,
   ``CREATE_GROUP``, the 8 records SET to staging keys, the record script, EXEC) with the real
   record script, with that script less its per-rollout writes (RENAME from staging and the
   rollout -> group key), and with a script that does nothing; 32 groups in flight.
3. The queue stage by stage, one after the other: ``record_group`` of every group, then their
   rewards (one list call per group, which publishes it), then the learner's reader (batches
   of 32, read and acked). For each stage, Redis's own ``INFO commandstats`` of the last round:
   calls and microseconds per group by command. A script's (EVALSHA's) time includes the
   commands it calls, which are listed too; what the commands do not account for is the I/O
   (reading the requests, writing the replies) and the AOF.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis  # noqa: E402

from benchmarks.bench_queue import GROUP, cpu_s, start_redis, stop  # noqa: E402
from gspo_rl.contract.schema import RolloutRecord, member_rollout_id, pack_rollout  # noqa: E402
from gspo_rl.redisq.client import make_redis  # noqa: E402
from gspo_rl.redisq.connection import run_script  # noqa: E402
from gspo_rl.redisq.groups.scripts import CREATE_GROUP, RECORD_ROLLOUTS  # noqa: E402
from gspo_rl.redisq.groups.store import RewardItem, RolloutStore  # noqa: E402
from gspo_rl.redisq.ready.reader import GroupReader  # noqa: E402
from tests.helpers.queue import make_rollout  # noqa: E402

_PER_ROLLOUT_WRITES = ("    redis.call('RENAME', sk, r_head .. rid .. r_tail)\n"
                       "    redis.call('SET', mk, group_id, 'EX', record_ttl)\n")
# record_group's variants: None is the store's own (records straight to their keys and
# RECORD_NEW_GROUP); the others open the group with CREATE_GROUP and stage the records for a
# record script, all in one MULTI/EXEC (the sampling path before the direct writes)
SCRIPTS = {"direct writes (ours)": None,
           "staged, record script": RECORD_ROLLOUTS.source,
           "staged, less per-rollout writes": RECORD_ROLLOUTS.source.replace(
               _PER_ROLLOUT_WRITES, ""),
           "staged, no-op script": "return {}"}
assert SCRIPTS["staged, less per-rollout writes"] != RECORD_ROLLOUTS.source


def bytes_in(client: redis.Redis, blobs: list[bytes], mode: str, tag: str, n: int) -> None:
    big = b"".join(blobs)
    for g0 in range(0, n, 32):
        p = client.pipeline(transaction=False)
        for g in range(g0, min(n, g0 + 32)):
            key = f"probe:{tag}:{g}"
            if mode == "8 SETs":
                for i, b in enumerate(blobs):
                    p.set(f"{key}:{i}", b, ex=3600)
            elif mode == "1 SET":
                p.set(key, big, ex=3600)
            else:
                p.xadd(f"probe:{tag}", {"group": big})
        p.execute()


async def record(url: str, script: str | None, groups: list[list[RolloutRecord]]) -> None:
    client = make_redis(url)
    store = RolloutStore(client)
    variant = client.register_script(script) if script is not None else None
    # loaded here: run_script loads only a transaction's last script if Redis lacks it
    create_sha = await client.script_load(CREATE_GROUP.source)
    sem = asyncio.Semaphore(32)

    async def staged(gid: str, recs: list[RolloutRecord]) -> None:
        k = store.keys
        opening = ("EVALSHA", create_sha, 4, k.group(gid), k.deadlines, k.group_activity,
                   k.counters, gid, GROUP, b"\x80", store.config.group_ttl_s,
                   store._finished_ttl, store.config.group_idle_s)
        writes = [("SET", k.rollout_staging(r.rollout_id), pack_rollout(r), "EX",
                   store._record_ttl) for r in recs]
        keys, args = RECORD_ROLLOUTS.slots(
            keys={"group_key": k.group(gid), "rollouts_key": k.group_rollouts(gid),
                  "rewards_key": k.group_rewards(gid), "active_key": k.group_activity},
            args={"group_id": gid}, constants=store._record_args,
            rest=[r.rollout_id for r in recs])
        out = await run_script(store._pipe, client, variant, keys, args,
                               before=[opening, *writes])
        assert script == "return {}" or out == [b"created"] * len(recs), out  # recorded

    async def one(recs: list[RolloutRecord]) -> None:
        async with sem:
            if variant is None:
                await store.record_group(recs[0].group_id, GROUP, None, recs)
            else:
                await staged(recs[0].group_id, recs)

    await asyncio.gather(*[one(r) for r in groups])
    await store.aclose()
    await client.aclose()


async def stage(url: str, groups: list[list[RolloutRecord]], what: str) -> None:
    client = make_redis(url)
    store = RolloutStore(client)
    sem = asyncio.Semaphore(32)

    async def one(recs: list[RolloutRecord]) -> None:
        async with sem:
            if what == "record":
                await store.record_group(recs[0].group_id, GROUP, None, recs)
            else:
                out = await store.post_rewards([RewardItem(r.rollout_id, float(i))
                                                for i, r in enumerate(recs)])
                assert out.applied and out.results[-1].group_complete

    await asyncio.gather(*[one(r) for r in groups])
    await store.aclose()
    await client.aclose()


def read_all(client: redis.Redis, n: int) -> None:
    reader = GroupReader(client)
    got = 0
    while got < n:
        b = reader.read_batch(32, current_version=0, timeout_s=1.0)
        reader.ack(b.entry_ids)
        got += len(b.groups)


def print_commandstats(stats: dict[str, Any], n: int, rows: int = 8) -> None:
    """The commands that took most of Redis's time, per group (``INFO commandstats``)."""
    top = sorted(((k.removeprefix("cmdstat_"), v) for k, v in stats.items()
                  if k != "cmdstat_config|resetstat"), key=lambda kv: -kv[1]["usec"])
    for name, v in top[:rows]:
        print(f"    {name:16s} {v['calls'] / n:6.2f} calls {v['usec'] / n:7.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--aof", choices=("yes", "no"), default="yes",
                    help="no: without the shipped AOF, whose rewrites (a fork, then the "
                         "parent's copy-on-write faults) land in whichever part is running")
    args = ap.parse_args()
    n = args.groups
    templates = [make_rollout(f"t{i}", "t", args.tokens, seed=i) for i in range(GROUP)]
    blobs = [pack_rollout(t) for t in templates]
    res: dict[str, list[float]] = {}
    stats: dict[str, dict[str, Any]] = {}  # stage -> INFO commandstats (the last round's)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_redis(Path(tmp), "--appendonly", args.aof)
        try:
            client = redis.Redis.from_url(url)
            for k in range(args.rounds):
                for mode in ("8 SETs", "1 SET", "XADD"):
                    c0 = cpu_s(proc.pid)
                    bytes_in(client, blobs, mode, f"{k}{mode}", n)
                    res.setdefault(f"bytes in: {mode}", []).append(cpu_s(proc.pid) - c0)
                # each variant on an empty Redis, in an order that rotates with the round (the
                # first after a flush or after the big writes above paid more in early runs)
                names = list(SCRIPTS)
                for name in names[k % len(names):] + names[:k % len(names)]:
                    script = SCRIPTS[name]
                    client.flushall()
                    groups = [[dataclasses.replace(t, rollout_id=f"{k}{name}{g}-r{i}",
                                                   group_id=f"{k}{name}{g}")
                               for i, t in enumerate(templates)] for g in range(n)]
                    c0 = cpu_s(proc.pid)
                    asyncio.run(record(url, script, groups))
                    res.setdefault(f"record_group: {name}", []).append(cpu_s(proc.pid) - c0)
                client.flushall()
                groups = [[dataclasses.replace(t, rollout_id=member_rollout_id(f"s{k}-{g}", i),
                                               group_id=f"s{k}-{g}")
                           for i, t in enumerate(templates)] for g in range(n)]
                for what in ("record", "reward + publish", "read + ack"):
                    client.config_resetstat()
                    c0 = cpu_s(proc.pid)
                    if what == "read + ack":
                        read_all(client, n)
                    else:
                        asyncio.run(stage(url, groups, what.split()[0]))
                    res.setdefault(f"stage: {what}", []).append(cpu_s(proc.pid) - c0)
                    stats[what] = client.info("commandstats")
                client.flushall()
            client.close()
        finally:
            stop(proc)
    print(f"Redis CPU per group of {GROUP} x {args.tokens} tokens, median of {args.rounds} "
          f"interleaved rounds of {n} groups (all rounds in brackets)")
    med = {}
    for name, v in res.items():
        ms = [1e3 * x / n for x in v]
        med[name] = statistics.median(ms)
        print(f"  {name:36s} {med[name]:6.3f} ms  {[round(x, 2) for x in ms]}")

    def ratio(a: str, b: str) -> str:
        return f"{med[a] / med[b]:.2f}" if med[b] > 0 else "n/a"

    for what, st in stats.items():
        print(f"  commands in stage '{what}' (last round), per group: calls, us of Redis time")
        print_commandstats(st, n)
    print(f"ratio 1 SET / 8 SETs: {ratio('bytes in: 1 SET', 'bytes in: 8 SETs')}, "
          f"XADD / 8 SETs: {ratio('bytes in: XADD', 'bytes in: 8 SETs')}")
    base = "record_group: staged, record script"
    print(f"ratio to the staged record script: direct writes (ours) "
          f"{ratio('record_group: direct writes (ours)', base)}, less per-rollout writes "
          f"{ratio('record_group: staged, less per-rollout writes', base)}, no-op script "
          f"{ratio('record_group: staged, no-op script', base)}")


if __name__ == "__main__":
    main()
