"""Simulated rollout servers and their environments: asyncio tasks in a worker process, each
one server (its own ``RolloutStore`` and connection, as a real server process has) that
emits groups in place of an engine and posts their rewards as an environment would.

Contract: ``worker_main`` (a ``multiprocessing`` target) runs one task per ``ServerSpec``:
per group, the admission read (``InFlightCounter.read``, what a server's gate does before it
starts a group), the records built (``fleet_emit``; the CPU this takes is counted apart, it is
the engine's side), ``record_group`` (what sampling does), then ``post_rewards`` for the whole
group (equal rewards for the groups marked to drop); each server also runs the store's sweeper
and publishes its pending count every second, as a server does. ``mode="raw"``: the baseline,
one redis-py ``XADD`` of the group's ``pack_ready_group`` bytes per published group (packed
off the clock), nothing for dropped ones. Servers start when ``go_flag`` is set; a run's
``interval_s`` > 0 paces each server to its share of the fleet's samples/s. Puts "ready",
then a ``Tally`` as a dict on ``out``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from benchmarks.lib.fleet_emit import GroupMaker, Shape, random_pool, rewards


@dataclass(frozen=True)
class ServerSpec:
    name: str
    seed: int
    drops: tuple[bool, ...]  # one per group this server emits: True -> equal rewards
    start_s: float = 0.0  # offset of its first group (paced runs)


@dataclass(frozen=True)
class RunSpec:
    url: str
    shape: Shape
    mode: str  # "ours" | "raw"
    interval_s: float  # seconds between a server's groups (0: as fast as it can)
    admission: bool = True


class Gate:
    """Servers check in once connected; ``go`` starts them all."""

    def __init__(self, n: int) -> None:
        self.n, self.arrived = n, 0
        self.all_in, self.go = asyncio.Event(), asyncio.Event()

    async def check_in(self) -> None:
        self.arrived += 1
        if self.arrived == self.n:
            self.all_in.set()
        await self.go.wait()


@dataclass
class Tally:
    cpu_s: float = 0.0  # process CPU from "go" to the end
    build_s: float = 0.0  # of which building records (and, raw, packing them): not the queue's
    samples: int = 0
    tokens: int = 0  # record tokens (prompt + completion)
    completion: int = 0
    published: int = 0
    dropped: int = 0
    start: float = 0.0
    end: float = 0.0
    errors: list[str] = field(default_factory=list)


async def _pace(spec: ServerSpec, run: RunSpec, t0: float, k: int) -> None:
    if run.interval_s > 0:
        delay = t0 + spec.start_s + k * run.interval_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)


def _build(maker: GroupMaker, gid: str, lengths: np.ndarray, tally: Tally,
           meta: dict[str, Any]) -> list[Any]:
    c0 = time.process_time()
    recs = maker.records(gid, lengths, meta)
    tally.build_s += time.process_time() - c0
    return recs


def _count(tally: Tally, lengths: np.ndarray, shape: Shape, drop: bool) -> None:
    tally.samples += len(lengths)
    tally.completion += int(lengths.sum())
    tally.tokens += int(lengths.sum()) + shape.prompt * len(lengths)
    tally.published += not drop
    tally.dropped += drop


async def _every_second(call: Callable[[], Awaitable[Any]], stop: asyncio.Event) -> None:
    """``call()`` now and then every second until ``stop`` is set: a server's sweeper
    (``RolloutStore.run_sweeper``) and its pending count (``InFlightCounter.publish_loop``,
    every ``PUBLISH_EVERY_S``), stopped by an event rather than a cancel, which a Redis call
    in flight may swallow."""
    while not stop.is_set():
        await call()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def serve_ours(spec: ServerSpec, run: RunSpec, pool: Any, tally: Tally,
                     gate: Gate) -> None:
    """One server and its environment through the real store (module docstring)."""
    from gspo_rl.contract.schema import Keys
    from gspo_rl.redisq.client import make_redis
    from gspo_rl.redisq.groups.store import RewardItem, RolloutStore
    from gspo_rl.redisq.inflight import InFlightCounter

    client = make_redis(run.url, max_connections=8)
    store = RolloutStore(client)
    counter = InFlightCounter(client, Keys(), spec.name, pipe=store.pipe)
    maker = GroupMaker(run.shape, spec.seed, pool)
    pending = 0
    await (store.pipe.execute("PING") if store.pipe else client.ping())
    await gate.check_in()
    stop = asyncio.Event()
    bg = [asyncio.create_task(_every_second(store.sweep_once, stop))]
    if run.admission:
        bg.append(asyncio.create_task(_every_second(lambda: counter.publish(pending), stop)))
    t0 = time.perf_counter()
    try:
        for k, drop in enumerate(spec.drops):
            await _pace(spec, run, t0, k)
            if run.admission:
                await counter.read()
            pending += 1
            gid, lengths = f"{spec.name}-g{k}", maker.lengths()
            recs = _build(maker, gid, lengths, tally, {"server_id": spec.name,
                                                        "route": "/v1/completions"})
            await store.record_group(gid, run.shape.group, {"task_id": f"t{k % 97}"}, recs)
            pending -= 1
            rs = rewards(maker.rng, run.shape.group, drop)
            out = await store.post_rewards([RewardItem(r.rollout_id, x)
                                            for r, x in zip(recs, rs, strict=True)])
            if not (out.applied and out.results[-1].group_complete):
                tally.errors.append(f"{gid}: rewards not applied")
            _count(tally, lengths, run.shape, drop)
    finally:
        stop.set()
        await asyncio.wait(bg, timeout=15)
        await store.aclose()
        await client.aclose()


async def serve_raw(spec: ServerSpec, run: RunSpec, pool: Any, tally: Tally,
                    gate: Gate) -> None:
    """The baseline: one XADD of the packed ready group per published group."""
    import redis.asyncio as aioredis

    from gspo_rl.contract.schema import READY_STREAM_FIELD, Keys, ReadyGroup
    from gspo_rl.contract.schema import pack_ready_group as pack

    client = aioredis.Redis.from_url(run.url, max_connections=2)
    stream = Keys().ready_stream
    maker = GroupMaker(run.shape, spec.seed, pool)
    await client.ping()
    await gate.check_in()
    t0 = time.perf_counter()
    try:
        for k, drop in enumerate(spec.drops):
            await _pace(spec, run, t0, k)
            gid, lengths = f"{spec.name}-g{k}", maker.lengths()
            rs = rewards(maker.rng, run.shape.group, drop)
            if not drop:
                c0 = time.process_time()
                recs = maker.records(gid, lengths, {"server_id": spec.name})
                payload = pack(ReadyGroup(gid, recs, rs, [0.0] * len(rs), [None] * len(rs),
                                          {"task_id": f"t{k % 97}"}, time.time()))
                tally.build_s += time.process_time() - c0
                await client.xadd(stream, {READY_STREAM_FIELD: payload})
            _count(tally, lengths, run.shape, drop)
    finally:
        await client.aclose()


async def _worker(specs: list[ServerSpec], run: RunSpec, pool: Any, ready: Any,
                  go_flag: Any) -> Tally:
    tally, gate = Tally(), Gate(len(specs))
    serve = serve_ours if run.mode == "ours" else serve_raw
    tasks = [asyncio.create_task(serve(s, run, pool, tally, gate)) for s in specs]
    waiter = asyncio.create_task(gate.all_in.wait())
    await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if not waiter.done():  # a server failed before it connected
        for t in (waiter, *tasks):
            t.cancel()
        failed = await asyncio.gather(*tasks, return_exceptions=True)
        tally.errors += [repr(r) for r in failed if isinstance(r, BaseException)][:5]
        ready.put("ready")
        return tally
    ready.put("ready")
    await asyncio.get_running_loop().run_in_executor(None, go_flag.wait)
    tally.start, c0 = time.time(), time.process_time()
    gate.go.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    tally.cpu_s, tally.end = time.process_time() - c0, time.time()
    tally.errors += [repr(r) for r in results if isinstance(r, BaseException)][:5]
    return tally


def worker_main(specs: list[ServerSpec], run: RunSpec, ready: Any, go_flag: Any,
                out: Any) -> None:
    """Process target (module docstring)."""
    pool = random_pool(2 * run.shape.max_tokens + 1, seed=zlib.crc32(specs[0].name.encode()))
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        tally = runner.run(_worker(specs, run, pool, ready, go_flag))
    out.put(asdict(tally))
