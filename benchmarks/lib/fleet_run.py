"""One measured point of the fleet simulator: a flushed Redis, one reader process and the
simulated servers in worker processes, started together; CPU per generated sample of Redis,
the reader and the servers' store clients.

Contract: ``run_point`` plans the groups (count from ``RunParams.run_bytes`` within the sample
bounds; which are dropped from a seeded draw, the same for ``ours`` and ``raw``), spreads them
round-robin over ``servers`` simulated servers in ``min(workers, servers)`` processes, starts
the reader, waits until every server is connected, then reads Redis's CPU, lets them go, and
reads it again once the reader has every published group. Returns a ``Point``: per generated
sample, microseconds of Redis CPU (main thread, all threads, AOF-rewrite children), reader CPU
and store-client CPU (record building excluded), tokens per sample, and the wall rate (for
information: it depends on the machine's load). Raises if a server or the reader failed.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import queue
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from benchmarks.lib.fleet_emit import BYTES_PER_TOKEN, Shape
from benchmarks.lib.fleet_reader import reader_main
from benchmarks.lib.fleet_redis import redis_cpu
from benchmarks.lib.fleet_servers import RunSpec, ServerSpec, worker_main

READY_TIMEOUT_S = 180
RUN_TIMEOUT_S = 600


@dataclass(frozen=True)
class RunParams:
    url: str
    workers: int
    drop_fraction: float
    run_bytes: float
    min_samples: int
    max_samples: int
    reader_batch_samples: int
    reader_step_s: float
    admission: bool
    seed: int


@dataclass(frozen=True)
class Point:
    samples: int
    published: int  # groups
    tokens: float  # mean record tokens per sample
    completion: float  # mean completion (generated) tokens per sample
    redis_us: float  # Redis main thread CPU per generated sample
    redis_all_us: float  # all Redis threads
    redis_children_us: float  # forked children (AOF rewrites)
    reader_us: float  # reader CPU per generated sample
    writer_us: float  # store clients' CPU per generated sample (building records excluded)
    build_us: float  # building (and, raw, packing) records per generated sample
    wall_per_s: float  # generated samples per wall second (information only)


def best(points: list[Point]) -> Point:
    """Repeats of one point: the least CPU per sample of each process (other work on the
    machine only adds to it: preemptions, cold caches), the highest wall rate."""
    first = points[0]
    return dataclasses.replace(first, **{
        f.name: (max if f.name == "wall_per_s" else min)(getattr(p, f.name) for p in points)
        for f in dataclasses.fields(Point) if f.name.endswith(("_us", "_per_s"))})


def plan(p: RunParams, shape: Shape, servers: int, rate: float) -> tuple[list[ServerSpec], float]:
    """The servers' groups, and the seconds between a server's groups (0: unpaced)."""
    n = int(min(p.max_samples, max(p.min_samples,
                                   p.run_bytes / (shape.tokens * BYTES_PER_TOKEN))))
    n_groups = max(1, math.ceil(n / shape.group))
    rng = np.random.default_rng(p.seed)
    drops = rng.random(n_groups) < p.drop_fraction
    interval = servers * shape.group / rate if rate > 0 else 0.0
    specs = [ServerSpec(name=f"sim{s}", seed=p.seed * 100_003 + s,
                        drops=tuple(bool(d) for d in drops[s::servers]),
                        start_s=float(rng.uniform(0, interval)))
             for s in range(servers)]
    return [s for s in specs if s.drops], interval


def _start(ctx: Any, specs: list[ServerSpec], run: RunSpec, p: RunParams, n_pub: int,
           shape: Shape) -> tuple[list[Any], Any, Any, Any]:
    q_reader, q_ready, q_out, go = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Event()
    batch = max(1, p.reader_batch_samples // shape.group)
    procs = [ctx.Process(target=reader_main, args=(
        p.url, run.mode, n_pub, batch, shape.group, p.reader_step_s, 60.0, q_reader))]
    n_workers = max(1, min(p.workers, len(specs)))
    procs += [ctx.Process(target=worker_main, args=(specs[w::n_workers], run, q_ready, go, q_out))
              for w in range(n_workers)]
    for proc in procs:
        proc.start()
    try:
        _get(q_reader, procs, READY_TIMEOUT_S)
        for _ in range(n_workers):
            _get(q_ready, procs, READY_TIMEOUT_S)
    except BaseException:
        _stop(procs, wait_s=0)
        raise
    return procs, q_reader, q_out, go


def _get(q: Any, procs: list[Any], timeout_s: float) -> Any:
    """The next item of ``q``; raises as soon as one of ``procs`` died, or on time out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return q.get(timeout=1.0)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"no answer from the simulation's processes (exit codes "
                                   f"{[p.exitcode for p in procs]})") from None


def _stop(procs: list[Any], wait_s: float = 30) -> None:
    for proc in procs:
        proc.join(timeout=wait_s)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=10)


def run_point(url: str, p: RunParams, shape: Shape, servers: int, rate: float,
              mode: str) -> Point:
    """One run (module docstring)."""
    client = redis.Redis.from_url(url)
    client.flushall()
    specs, interval = plan(p, shape, servers, rate)
    n_pub = sum(not d for s in specs for d in s.drops)
    run = RunSpec(url=url, shape=shape, mode=mode, interval_s=interval, admission=p.admission)
    procs, q_reader, q_out, go = _start(mp.get_context("spawn"), specs, run, p, n_pub, shape)
    try:
        cpu0 = redis_cpu(client)
        go.set()
        rd = _get(q_reader, procs, RUN_TIMEOUT_S)
        # the servers end with the reader (their last groups may be dropped ones)
        tallies = [_get(q_out, procs, 120) for _ in procs[1:]]
        cpu = redis_cpu(client) - cpu0
    finally:
        _stop(procs)
    client.flushall()
    client.close()
    errors = [e for t in tallies for e in t["errors"]]
    if errors or rd["stalled"] or rd["unreadable"]:
        raise RuntimeError(f"{mode} {shape.name} x {servers} servers: errors {errors[:3]}, "
                           f"reader {rd}")
    return _point(tallies, rd, cpu, n_pub)


def _point(tallies: list[dict], rd: dict, cpu: Any, n_pub: int) -> Point:
    n = sum(t["samples"] for t in tallies)
    wall = max(rd["end"], *(t["end"] for t in tallies)) - min(t["start"] for t in tallies)
    us = 1e6 / n
    return Point(
        samples=n, published=n_pub, tokens=sum(t["tokens"] for t in tallies) / n,
        completion=sum(t["completion"] for t in tallies) / n, redis_us=cpu.main * us,
        redis_all_us=cpu.total * us, redis_children_us=cpu.children * us,
        reader_us=rd["cpu_s"] * us,
        writer_us=sum(t["cpu_s"] - t["build_s"] for t in tallies) * us,
        build_us=sum(t["build_s"] for t in tallies) * us, wall_per_s=n / wall)
