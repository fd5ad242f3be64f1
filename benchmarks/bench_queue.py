"""The reward API and the Redis queue: throughput, against baselines measured in the same run.

`.venv/bin/python benchmarks/bench_queue.py`

1. Reward posts per second over HTTP: 64 concurrent keep-alive clients post single rewards
   to ``POST /v1/rewards`` (uvicorn, uvloop + httptools when installed, one worker) backed by
   a real redis-server (the shipped ``docker/redis.conf``: AOF, everysec). Baseline: the same
   server's ``POST /bench/noop``, which parses the same body and touches no Redis (the HTTP
   ceiling of this stack on this machine). The load generator is a minimal asyncio HTTP/1.1
   client in another process (httpx alone costs more CPU than the server it measures).
2. Groups per second end to end through Redis, groups of 8 rollouts x 1,024 tokens: record
   (``record_group``: the group opened and its 8 records packed and written in one round
   trip, as the sampling path does; the ``RolloutRecord`` objects are made before the clock
   starts, as the baseline's payloads are), reward (one list call per group, which publishes
   it: the Lua credit rule and the XADD of the head), read (``GroupReader`` in another
   process: XREADGROUP, one MGET of the records, decode), ack (the ack/trim script, which
   gives the records of trimmed entries their expiry). Baseline: raw redis-py ``XADD`` of
   the same ready-group bytes (packed before the clock starts) and ``XREADGROUP`` + ``XACK``
   of them (not decoded), same concurrency, same reader process layout. ``--pairs`` runs
   each way, back to back, the order alternating (on 2 cores, whichever runs second meets
   the first's AOF growth and its rewrites); the ratios printed are medians of the pairs'.
3. msgpack (``pack_ready_group``) against JSON for the same ready-group records: bytes, and
   encode + decode time (JSON carries arrays as lists of numbers: it has no bytes type).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Light imports only at the top: every reader process (spawned) imports this module again, and
# the server's routes import torch. They are imported where the app is made.
from gspo_rl.redisq.client import make_redis  # noqa: E402
from gspo_rl.redisq.groups.store import RolloutStore  # noqa: E402
from tests.conftest import free_port, wait_for_port  # noqa: E402

if TYPE_CHECKING:
    from fastapi import FastAPI

TOKENS = 1024
GROUP = 8


def bench_app() -> FastAPI:
    """The app served in part 1 (``uvicorn --factory benchmarks.bench_queue:bench_app``)."""
    from fastapi import FastAPI

    from gspo_rl.server.api.errors import install_error_handlers
    from gspo_rl.server.api.routes import groups, rewards

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = make_redis(os.environ["GSPO_BENCH_REDIS_URL"])
        app.state.store = RolloutStore(client)
        task = asyncio.create_task(app.state.store.run_sweeper(1.0))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await app.state.store.aclose()
        await client.aclose()

    app = FastAPI(lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(rewards.router)
    app.include_router(groups.router)

    async def noop(body) -> dict[str, int]:  # noqa: ANN001 - its type is set below
        return {"n": 1 if not isinstance(body, list) else len(body)}

    # the same body model as /v1/rewards (a local name: FastAPI reads annotations as globals)
    noop.__annotations__["body"] = rewards.RewardsBody
    app.post("/bench/noop")(noop)
    return app


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_redis(tmp: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """redis-server with the shipped ``docker/redis.conf``; ``extra``: more options."""
    exe = shutil.which("redis-server")
    assert exe, "redis-server not found"
    port = free_port()
    proc = subprocess.Popen(
        [exe, str(REPO / "docker" / "redis.conf"), "--port", str(port), "--bind", "127.0.0.1",
         "--dir", str(tmp), "--loglevel", "warning", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, proc)
    return proc, f"redis://127.0.0.1:{port}/0"


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


# ---------------------------------------------------------------- part 1: HTTP reward posts


async def _http_worker(port: int, path: bytes, bodies: list[bytes]) -> list[int]:
    """Posts ``bodies`` one after another on one keep-alive connection; returns statuses."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    statuses = []
    for body in bodies:
        writer.write(b"POST %s HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (path, len(body), body))
        status = int((await reader.readline()).split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await reader.readexactly(length)
        statuses.append(status)
    writer.close()
    return statuses


async def _post_all(port: int, path: bytes, bodies: list[bytes], clients: int) -> float:
    shares = [bodies[i::clients] for i in range(clients)]
    t0 = time.perf_counter()
    results = await asyncio.gather(*[_http_worker(port, path, s) for s in shares])
    dt = time.perf_counter() - t0
    bad = [s for r in results for s in r if s != 200]
    assert not bad, f"{len(bad)} non-200 responses, e.g. {bad[:5]}"
    return len(bodies) / dt


async def _prepare_groups(url: str, n_groups: int, tokens: int) -> list[str]:
    from tests.helpers.queue import make_rollout

    client = make_redis(url)
    store = RolloutStore(client)
    ids: list[str] = []
    for g in range(n_groups):
        gid = f"h{g}"
        await store.create_group(gid, GROUP)
        recs = [make_rollout(f"{gid}-r{i}", gid, tokens, seed=i) for i in range(GROUP)]
        await store.record_rollouts(recs)
        ids += [r.rollout_id for r in recs]
    await store.aclose()
    await client.aclose()
    return ids


def bench_http(url: str, redis_pid: int, n_rewards: int, clients: int,
               tokens: int) -> dict[str, float]:
    import redis

    port = free_port()
    env = {**os.environ, "GSPO_BENCH_REDIS_URL": url, "PYTHONPATH": str(REPO)}
    loop_opts = ["--loop", "uvloop", "--http", "httptools"]
    try:
        import httptools  # noqa: F401
        import uvloop  # noqa: F401
    except ImportError:
        loop_opts = []
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "benchmarks.bench_queue:bench_app",
         "--port", str(port), "--log-level", "warning", "--no-access-log", *loop_opts],
        env=env, cwd=str(REPO))
    try:
        wait_for_port(port, server, timeout=60)
        ids = asyncio.run(_prepare_groups(url, n_rewards // GROUP, tokens))
        bodies = [json.dumps({"rollout_id": rid, "reward": (i % 7) / 7}).encode()
                  for i, rid in enumerate(ids)]
        asyncio.run(_post_all(port, b"/bench/noop", bodies[:2000], clients))  # warm up
        pids = (server.pid, redis_pid)
        c0 = [cpu_s(p) for p in pids]
        noop = asyncio.run(_post_all(port, b"/bench/noop", bodies, clients))
        c1 = [cpu_s(p) for p in pids]
        ours = asyncio.run(_post_all(port, b"/v1/rewards", bodies, clients))
        c2 = [cpu_s(p) for p in pids]
        r = redis.Redis.from_url(url)
        published = int(r.hget("gspo:counters", "groups_published") or 0)
        assert published == len(ids) // GROUP, (published, len(ids) // GROUP)
        r.close()
    finally:
        stop(server)
    n = len(bodies)
    return {"rewards_per_s": ours, "noop_per_s": noop, "loop": bool(loop_opts),
            "noop_server_us": 1e6 * (c1[0] - c0[0]) / n, "noop_redis_us": 1e6 * (c1[1] - c0[1]) / n,
            "ours_server_us": 1e6 * (c2[0] - c1[0]) / n, "ours_redis_us": 1e6 * (c2[1] - c1[1]) / n}


# ---------------------------------------------------------------- part 2: end to end


def _consume(url: str, n_groups: int, raw: bool, batch: int, out: Any) -> None:
    """Reader process: reads and acks ``n_groups`` groups, then reports the time it finished."""
    import redis

    from gspo_rl.contract.gc_freeze import freeze_startup_objects
    from gspo_rl.contract.schema import LEARNER_CONSUMER_GROUP, Keys
    from gspo_rl.redisq.ready.reader import GroupReader

    client = redis.Redis.from_url(url)
    stream = Keys().ready_stream
    got = 0
    # as a learner does once started (``Learner.run``), both ways: a full collection walking
    # the start-up objects is not the queue's cost
    freeze_startup_objects()
    cpu0 = time.process_time()  # not counting this process's start-up (imports)
    if raw:
        with contextlib.suppress(redis.ResponseError):
            client.xgroup_create(stream, LEARNER_CONSUMER_GROUP, id="0", mkstream=True)
        out.put("ready")
        while got < n_groups:
            res = client.xreadgroup(LEARNER_CONSUMER_GROUP, "raw", {stream: ">"}, count=batch,
                                    block=1000)
            if res:
                ids = [i for i, _ in res[0][1]]
                client.xack(stream, LEARNER_CONSUMER_GROUP, *ids)
                got += len(ids)
    else:
        reader = GroupReader(client)
        out.put("ready")
        while got < n_groups:
            # no more than are still to come: a full batch's wait (timeout_s) for groups that
            # will never be produced would count as queue time
            b = reader.read_batch(min(batch, n_groups - got), current_version=0, timeout_s=1.0)
            reader.ack(b.entry_ids)
            got += len(b.groups)
    out.put((time.perf_counter(), time.process_time() - cpu0))


async def _produce_ours(url: str, records: list[list[Any]], concurrency: int) -> None:
    from gspo_rl.redisq.groups.store import RewardItem

    n_groups = len(records)
    client = make_redis(url)
    store = RolloutStore(client)
    sem = asyncio.Semaphore(concurrency)

    async def one(g: int) -> None:
        async with sem:
            gid = f"e{g}"
            recs = records[g]
            await store.record_group(gid, GROUP, None, recs)  # what sampling does
            out = await store.post_rewards(
                [RewardItem(r.rollout_id, float(i)) for i, r in enumerate(recs)])
            assert out.applied and out.results[-1].group_complete

    await asyncio.gather(*[one(g) for g in range(n_groups)])
    await store.aclose()
    await client.aclose()


async def _produce_raw(url: str, payloads: list[bytes], concurrency: int) -> None:
    import redis.asyncio as aioredis

    from gspo_rl.contract.schema import READY_STREAM_FIELD, Keys

    client = aioredis.Redis.from_url(url, max_connections=concurrency * 2)
    sem = asyncio.Semaphore(concurrency)
    stream = Keys().ready_stream

    async def one(p: bytes) -> None:
        async with sem:
            await client.xadd(stream, {READY_STREAM_FIELD: p})

    await asyncio.gather(*[one(p) for p in payloads])
    await client.aclose()


def _group_records(n: int, tokens: int) -> list[list[Any]]:
    """The rollout records of ``n`` groups (made before the clock starts, as the raw
    baseline's payloads are: building them is the sampler's work, not the queue's; packing
    them is the store's, and is timed)."""
    from gspo_rl.contract.schema import member_rollout_id
    from tests.helpers.queue import make_rollout

    templates = [make_rollout(f"t{i}", "t", tokens, seed=i) for i in range(GROUP)]
    # the ids the sampling path mints (they name their group: no rollout -> group keys)
    return [[dataclasses.replace(t, rollout_id=member_rollout_id(f"e{g}", i), group_id=f"e{g}")
             for i, t in enumerate(templates)] for g in range(n)]


def _ready_payloads(n: int, tokens: int) -> list[bytes]:
    from gspo_rl.contract.schema import ReadyGroup, pack_ready_group
    from tests.helpers.queue import make_rollout

    rollouts = [make_rollout(f"r{i}", "g", tokens, seed=i) for i in range(GROUP)]
    out = []
    for g in range(n):
        grp = ReadyGroup(f"e{g}", rollouts, [float(i) for i in range(GROUP)],
                         [0.1 * i for i in range(GROUP)], [None] * GROUP, {}, time.time())
        out.append(pack_ready_group(grp))
    return out


def _run_e2e(url: str, redis_pid: int, n_groups: int, raw: bool, concurrency: int,
             tokens: int) -> dict[str, float]:
    """Groups per second, and CPU ms per group of the producer, the reader and Redis."""
    import redis

    redis.Redis.from_url(url).flushall()
    payloads = _ready_payloads(n_groups, tokens) if raw else []
    records = [] if raw else _group_records(n_groups, tokens)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_consume, args=(url, n_groups, raw, 32, q))
    proc.start()
    assert q.get(timeout=120) == "ready"
    redis0, prod0 = cpu_s(redis_pid), time.process_time()
    t0 = time.perf_counter()
    if raw:
        asyncio.run(_produce_raw(url, payloads, concurrency))
    else:
        asyncio.run(_produce_ours(url, records, concurrency))
    prod = time.process_time() - prod0
    t_end, reader_cpu = q.get(timeout=600)
    redis_cpu = cpu_s(redis_pid) - redis0
    proc.join(timeout=60)
    return {"per_s": n_groups / (t_end - t0), "producer_ms": 1e3 * prod / n_groups,
            "reader_ms": 1e3 * reader_cpu / n_groups, "redis_ms": 1e3 * redis_cpu / n_groups}


E2E_KEYS = ("producer_ms", "reader_ms", "redis_ms")


def bench_e2e(url: str, redis_pid: int, n_groups: int, concurrency: int, tokens: int,
              pairs: int) -> dict[str, Any]:
    """``pairs`` runs each way, back to back, the order alternating (what runs second meets
    the first's AOF growth and rewrites); per-way medians, and the medians (and ranges) of the
    pairs' ratios ours / raw."""
    _run_e2e(url, redis_pid, min(200, n_groups), False, concurrency, tokens)  # warm up
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "raw": []}
    for i in range(pairs):
        for raw in ((True, False) if i % 2 == 0 else (False, True)):
            runs["raw" if raw else "ours"].append(
                _run_e2e(url, redis_pid, n_groups, raw, concurrency, tokens))
    rate = [o["per_s"] / r["per_s"] for o, r in zip(runs["ours"], runs["raw"], strict=True)]
    cpu = [sum(r[k] for k in E2E_KEYS) / sum(o[k] for k in E2E_KEYS)
           for o, r in zip(runs["ours"], runs["raw"], strict=True)]
    med = {way: {k: statistics.median(d[k] for d in ds) for k in ("per_s", *E2E_KEYS)}
           for way, ds in runs.items()}
    return {**med, "rate": rate, "cpu": cpu}


# ---------------------------------------------------------------- part 3: msgpack vs JSON


def bench_codec(n: int, tokens: int) -> dict[str, float]:
    from gspo_rl.contract.schema import pack_ready_group, unpack_ready_group

    payloads = _ready_payloads(n, tokens)
    groups = [unpack_ready_group(p) for p in payloads]

    def to_json(g: Any) -> bytes:
        return json.dumps({
            "group_id": g.group_id, "metadata": g.metadata, "published_at": g.published_at,
            "rewards": g.rewards, "advantages": g.advantages, "turn_rewards": g.turn_rewards,
            "rollouts": [{
                "rollout_id": r.rollout_id, "group_id": r.group_id,
                "token_ids": r.token_ids.tolist(), "loss_mask": r.loss_mask.tolist(),
                "logprobs": r.logprobs.tolist(), "versions": r.versions.tolist(),
                "prompt_len": r.prompt_len, "temperature": r.temperature, "turns": r.turns,
                "finish_reason": r.finish_reason, "created_at": r.created_at,
                "metadata": r.metadata} for r in g.rollouts]}).encode()

    def from_json(b: bytes) -> Any:
        import numpy as np

        d = json.loads(b)
        for r in d["rollouts"]:
            r["token_ids"] = np.asarray(r["token_ids"], np.int32)
            r["loss_mask"] = np.asarray(r["loss_mask"], np.uint8)
            r["logprobs"] = np.asarray(r["logprobs"], np.float32)
            r["versions"] = np.asarray(r["versions"], np.int32)
        return d

    t0 = time.perf_counter()
    packed = [pack_ready_group(g) for g in groups]
    for p in packed:
        unpack_ready_group(p)
    t_mp = time.perf_counter() - t0
    t0 = time.perf_counter()
    js = [to_json(g) for g in groups]
    for j in js:
        from_json(j)
    t_js = time.perf_counter() - t0
    return {"msgpack_bytes": len(packed[0]), "json_bytes": len(js[0]),
            "msgpack_ms": 1e3 * t_mp / n, "json_ms": 1e3 * t_js / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rewards", type=int, default=6_400, help="reward posts (part 1)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--groups", type=int, default=2_000, help="groups end to end (part 2)")
    ap.add_argument("--concurrency", type=int, default=32, help="groups in flight (part 2)")
    ap.add_argument("--pairs", type=int, default=3, help="runs each way, alternating (part 2)")
    ap.add_argument("--tokens", type=int, default=TOKENS)
    ap.add_argument("--codec-groups", type=int, default=200)
    args = ap.parse_args()
    import timeit

    # The producers run in this process: it holds the server's modules, as it always has (a
    # full garbage collection's work depends on what is loaded); the readers do not need them.
    import gspo_rl.server.api.routes.groups  # noqa: F401
    import gspo_rl.server.api.routes.rewards  # noqa: F401

    calib = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6
    print(f"cpus: {os.cpu_count()}, load average before: {os.getloadavg()}, "
          f"sum(range(1000)): {calib:.1f} us (about 8-10 us on an idle modern core)")
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_redis(Path(tmp))
        try:
            http = bench_http(url, proc.pid, args.rewards, args.clients, args.tokens)
            e2e = bench_e2e(url, proc.pid, args.groups, args.concurrency, args.tokens,
                            args.pairs)
        finally:
            stop(proc)
    codec = bench_codec(args.codec_groups, args.tokens)
    print(f"load average after: {os.getloadavg()} (other work on the machine skews wall rates;"
          " CPU per item does not depend on it as much)")

    print(f"\n1. reward posts over HTTP, {args.clients} clients, {args.rewards} posts "
          f"(uvloop+httptools: {http['loop']})")
    print(f"   ours  /v1/rewards : {http['rewards_per_s']:8.0f} /s   (goal >= 2000)   CPU per "
          f"post: server {http['ours_server_us']:5.0f} us, redis {http['ours_redis_us']:4.0f} us")
    print(f"   noop  /bench/noop : {http['noop_per_s']:8.0f} /s   (HTTP only)      CPU per "
          f"post: server {http['noop_server_us']:5.0f} us, redis {http['noop_redis_us']:4.0f} us")
    print(f"   ratio ours / noop : {http['rewards_per_s'] / http['noop_per_s']:.2f} (rate), "
          f"{http['noop_server_us'] / http['ours_server_us']:.2f} (server CPU)")
    ours, raw = e2e["ours"], e2e["raw"]
    print(f"\n2. end to end, groups of {GROUP} x {args.tokens} tokens, {args.groups} groups, "
          f"{args.concurrency} in flight; {args.pairs} pairs of runs, order alternating; "
          "medians")
    for name, d in (("ours (record, reward, publish, read, ack)", ours),
                    ("raw XADD + XREADGROUP + XACK, same bytes ", raw)):
        total = sum(d[k] for k in E2E_KEYS)
        print(f"   {name}: {d['per_s']:6.0f} groups/s; CPU ms/group: producer "
              f"{d['producer_ms']:.2f}, reader {d['reader_ms']:.2f}, redis {d['redis_ms']:.2f},"
              f" total {total:.2f}")
    rate, cpu = e2e["rate"], e2e["cpu"]
    print(f"   ratio ours / raw: {statistics.median(rate):.2f} (rate) "
          f"[pairs {min(rate):.2f}..{max(rate):.2f}], {statistics.median(cpu):.2f} (total CPU "
          f"per group) [{min(cpu):.2f}..{max(cpu):.2f}] (goal >= 0.5)")
    print(f"\n3. one ready group ({GROUP} x {args.tokens} tokens): msgpack vs JSON")
    print(f"   bytes   msgpack {codec['msgpack_bytes']:>9,d}  json {codec['json_bytes']:>9,d}  "
          f"ratio json/msgpack {codec['json_bytes'] / codec['msgpack_bytes']:.2f}")
    print(f"   enc+dec msgpack {codec['msgpack_ms']:7.3f} ms  json {codec['json_ms']:7.3f} ms  "
          f"ratio json/msgpack {codec['json_ms'] / codec['msgpack_ms']:.1f}")


if __name__ == "__main__":
    main()
