"""Scoring off the event loop: how much slow scoring calls hold up the other groups.

    .venv/bin/python benchmarks/bench_scoring.py [--seconds 6 --repeats 5 --workers 32]

A single-turn environment against a real rollout server (``gspo serve``: hf engine on a tiny
model made on the spot, one torch thread, real Redis; admission and the ready queue's bound
off: no learner runs): tasks are numbers, ``--group-size`` samples of ``--max-tokens`` tokens
each, ``--concurrency`` groups in flight. One scoring call in ``--slow-every`` (10) sleeps
``--slow-s`` (1 s): the calls whose completion's CRC-32 is 0 modulo 10, so which calls are
slow is a property of the text, the same in every mode. The measure is the groups/s of the
*other* groups (none of their calls slow), counted the same way in every mode, over
``--seconds`` after a warm-up:

- baseline: no call sleeps, scoring on the event loop (``score_workers`` 0);
- pool: the slow calls sleep, scoring in ``--workers`` processes (``score_workers``);
- loop: the slow calls sleep on the event loop (the behaviour before the pool), for contrast;
- pool-fast: no call sleeps, scoring in the pool: the pool's own cost.

Each repeat runs the four modes back to back (their order rotating); the ratios to the
repeat's own baseline are printed with their median over ``--repeats``. Goal: pool/baseline
>= 0.9. Workers needed: at least the slow seconds per second (slow calls/s x ``--slow-s``);
concurrency: enough that the groups waiting on slow calls leave the server saturated.

``--math 0,1,2,4`` measures instead (offline, no server) the ``math`` verifier of tasks from
data on model-like text: groups/s and the event loop's longest stall, on the loop (0) and in
N workers (its ``score_workers`` default, 2, comes from this).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Light imports only at the top: every scoring worker (spawned) imports this module again.
from gspo_rl.client.environment import (  # noqa: E402
    SingleTurnEnvironment,
    close_scoring,
    score_group,
    scoring_pool,
)
from gspo_rl.client.runner import arun_groups  # noqa: E402

MODES = ("baseline", "pool", "loop", "pool-fast")


def is_slow(text: str, every: int) -> bool:
    return every > 0 and zlib.crc32(text.encode()) % every == 0


class SlowScoring(SingleTurnEnvironment):
    """Numbers as tasks; a score that sleeps ``slow_s`` on the calls ``is_slow`` picks."""

    def __init__(self, args: argparse.Namespace, slow_s: float, workers: int) -> None:
        self.group_size, self.slow_every, self.slow_s = args.group_size, args.slow_every, slow_s
        self.sampling = {"temperature": 1.0, "max_tokens": args.max_tokens}
        self.score_workers = workers
        self.next_task = 0

    def sample_task(self, rng: Any) -> int:
        self.next_task += 1
        return self.next_task

    def prompt(self, task: int) -> str:
        return f"Count on from {task}:"

    def score(self, task: int, completion: str) -> float:
        if is_slow(completion, self.slow_every):
            time.sleep(self.slow_s)
        return zlib.crc32(completion.encode()) % 997 / 997  # distinct texts: a learning signal


def make_env(mode: str, args: argparse.Namespace) -> SlowScoring:
    slow_s = args.slow_s if mode in ("pool", "loop") else 0.0
    return SlowScoring(args, slow_s, args.workers if mode.startswith("pool") else 0)


async def warm_pool(env: SlowScoring) -> None:
    """Start every worker before the clock runs (one fast call each, all at once)."""
    fast = next(t for t in ("a", "b", "c", "d", "e", "f", "g") if not is_slow(t, env.slow_every))
    await scoring_pool(env).score_many([(0, fast)] * env.score_workers)


async def phase(url: str, mode: str, args: argparse.Namespace,
                seconds: float) -> dict[str, float]:
    """Run ``mode`` for ``seconds``: the other groups done in that time, per second."""
    from benchmarks.bench_server import API_KEY
    from gspo_rl.client.client import AsyncGSPOClient
    from gspo_rl.client.failures import RunStats

    env, stats = make_env(mode, args), RunStats()
    other = slow = 0
    try:
        if env.score_workers:
            await warm_pool(env)
        stop = asyncio.Event()
        t0 = time.monotonic()

        def on_group(outcome: Any) -> None:
            nonlocal other, slow
            if time.monotonic() - t0 > seconds:
                stop.set()
                return
            hit = any(is_slow(t, args.slow_every) for t in outcome.texts)
            slow, other = slow + hit, other + (not hit)

        asyncio.get_running_loop().call_later(seconds, stop.set)
        async with AsyncGSPOClient(url, api_key=API_KEY) as client:
            await arun_groups(env, client, None, concurrency=args.concurrency, stop=stop,
                              on_group=on_group, stats=stats)
    finally:
        close_scoring(env)
    if stats.failed_attempts:
        raise SystemExit(f"{mode}: groups failed: {stats.summary()}")
    return {"other_gps": other / seconds, "other": other, "slow_groups": slow,
            "load": os.getloadavg()[0]}



def run_all(url: str, args: argparse.Namespace) -> dict[str, list[float]]:
    asyncio.run(phase(url, "baseline", args, args.warmup))  # server, HTTP, caches
    gps: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.repeats):
        for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
            res = asyncio.run(phase(url, mode, args, args.seconds))
            gps[mode].append(res["other_gps"])
            print(f"repeat {r + 1} {mode:>9}: {res['other']:4d} other groups in "
                  f"{args.seconds:g}s = {res['other_gps']:6.2f}/s ({res['slow_groups']} groups "
                  f"with a slow call; load average {res['load']:.1f})", flush=True)
    return gps


def report(gps: dict[str, list[float]], args: argparse.Namespace) -> None:
    base = gps["baseline"]
    print(f"\nother groups/s, median of {args.repeats} repeats: " + ", ".join(
        f"{m} {statistics.median(v):.2f}" for m, v in gps.items()))
    for mode, goal in (("pool", " (goal >= 0.9)"), ("loop", " (before the pool)"),
                       ("pool-fast", " (the pool's own cost)")):
        ratios = [x / b for x, b in zip(gps[mode], base, strict=True) if b > 0]
        spread = (f"{statistics.median(ratios):.2f} [{min(ratios):.2f}..{max(ratios):.2f}]"
                  if ratios else "n/a (no baseline group)")
        print(f"ratio {mode}/baseline (other groups/s): {spread}{goal}", flush=True)


WORDS = ("the", "answer", "is", "x", "=", "\\frac{1}{2}", "+", "3", "so", "\\boxed{", "}", "$",
         "12", "^2", "(", ")", "sqrt", "and")


def math_groups(n: int, seed: int = 0) -> list[tuple[Any, list[str]]]:
    """``n`` tasks from data, each with 8 answers of 30-200 words of model-like math text."""
    from gspo_rl.client.tasks.task import Task

    rng = random.Random(seed)

    def text() -> str:
        words = rng.choice((30, 100, 200))
        return " ".join(rng.choice((*WORDS, str(rng.randint(0, 999)))) for _ in range(words))

    return [(Task(id=f"t{i}", source="s", answer=str(rng.randint(0, 99)), prompt="q"),
             [text() for _ in range(8)]) for i in range(n)]


async def score_all(env: Any, groups: list[tuple[Any, list[str]]],
                    concurrency: int) -> tuple[float, float]:
    """Groups/s scoring ``groups``, ``concurrency`` at a time, and the event loop's longest
    stall meanwhile."""
    sem, stalls = asyncio.Semaphore(concurrency), [0.0]

    async def probe() -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.005)
            stalls.append(time.monotonic() - t - 0.005)

    async def one(task: Any, texts: list[str]) -> None:
        async with sem:
            await asyncio.sleep(0)  # as a group's HTTP calls would: the others run between
            await score_group(env, task, texts)

    watcher = asyncio.create_task(probe())
    t0 = time.monotonic()
    await asyncio.gather(*(one(task, texts) for task, texts in groups))
    elapsed = time.monotonic() - t0
    watcher.cancel()
    return len(groups) / elapsed, max(stalls)


def run_math(args: argparse.Namespace) -> None:
    """The ``math`` verifier of tasks from data: on the event loop, then in N workers."""
    from gspo_rl.client.tasks.environment import DataEnvironment
    from gspo_rl.client.tasks.sampler import TaskMixture, TaskSource
    from gspo_rl.client.verifiers import make_verifier

    verifier, warm = make_verifier("math"), math_groups(8, seed=-1)
    mixture = TaskMixture([TaskSource("s", [task for task, _ in warm])])
    asyncio.run(score_all(DataEnvironment(mixture, verifier, score_workers=0), warm, 8))
    gps: dict[int, list[float]] = {w: [] for w in args.math}
    for r in range(args.repeats):
        for workers in args.math if r % 2 == 0 else args.math[::-1]:
            env = DataEnvironment(mixture, verifier, score_workers=workers)
            # new texts each run: math-verify's caches must not remember an earlier run's
            groups = math_groups(args.math_groups, seed=1000 * r + workers)
            try:
                if workers:  # start them (and their imports) first
                    asyncio.run(score_all(env, warm[:workers], workers))
                rate, stall = asyncio.run(score_all(env, groups, 8))
            finally:
                close_scoring(env)
            gps[workers].append(rate)
            print(f"repeat {r + 1} math-verify, {workers} workers: {rate:5.1f} groups/s, "
                  f"longest event-loop stall {1e3 * stall:.0f} ms", flush=True)
    for workers in args.math:
        if workers and 0 in gps:
            ratios = [x / b for x, b in zip(gps[workers], gps[0], strict=True)]
            print(f"ratio {workers} workers/event loop (groups/s): "
                  f"{statistics.median(ratios):.2f} [{min(ratios):.2f}..{max(ratios):.2f}]")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=6.0, help="per mode and repeat")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workers", type=int, default=32, help="score_workers in the pool modes")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--slow-every", type=int, default=10)
    p.add_argument("--slow-s", type=float, default=1.0)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--math", type=lambda v: [int(x) for x in v.split(",")],
                   help="instead: the math verifier offline, on the loop (0) and in these "
                        "numbers of workers, e.g. 0,1,2,4")
    p.add_argument("--math-groups", type=int, default=40)
    args = p.parse_args()
    if args.math:
        run_math(args)
        return
    from benchmarks.bench_server import http_server, redis_server
    from gspo_rl.tiny_model import make_tiny_model

    os.environ["GSPO_MAX_READY_GROUPS"] = "0"  # no learner reads the groups: no bound
    os.environ["OMP_NUM_THREADS"] = "1"  # the server's torch: no spinning threads on few cores
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "tiny")
        serve = argparse.Namespace(max_tokens=args.max_tokens,
                                   max_batch_size=args.max_batch_size, device="cpu",
                                   dtype="float32")
        with redis_server(Path(tmp)) as (redis_url, _), \
                http_server(model, redis_url, serve) as (url, _):
            report(run_all(url, args), args)


if __name__ == "__main__":
    main()
