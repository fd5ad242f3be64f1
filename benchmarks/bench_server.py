"""What the HTTP server costs on top of its engine: the same requests, both ways, in one run.

    .venv/bin/python benchmarks/bench_server.py [--max-tokens 128 --concurrency 32 --rounds 6]

Baseline: the hf engine called directly (``engine.generate`` from asyncio, in this process).
Measured: ``gspo serve`` (hf engine, same model, real Redis recording every rollout) in a
subprocess, driven over HTTP (``POST /v1/completions`` with a token-id prompt) by a lean
keep-alive HTTP/1.1 client in this process (``LeanClient``). Every request is ``prompt_len``
token ids and a per-request seed, with ``ignore_eos``, so both ways generate exactly the same
tokens. At c=1 and in the "fixed" c=N workload every request generates ``max_tokens``
tokens; in the "mixed" workload lengths are spread uniformly over [max_tokens/2,
3*max_tokens/2] as in RL, where rollouts end at different lengths. Fixed lengths are the
worst case for the server: all N requests end in the same step, the direct baseline refills
the batch within microseconds while HTTP requests trickle in and are admitted over several
engine steps.

Measurements are paired: at c=1 one request each way back to back, at c=N one phase each way
back to back, the order alternating; the reported ratios are medians of the pairs' ratios, so
load from other processes on a shared machine hits both sides of a pair alike.

Prints: latency ratio at 1 request in flight (goal: server <= 1.05x engine), throughput ratio
at N in flight (goal: server >= 0.95x engine tokens/s), and the engine's own batching gain
(tokens/s at N over tokens/s at 1; goal >= 4x). Because wall-clock ratios on a machine shared
with other jobs swing with their load, it also prints the CPU time per generated token of the
serving process (server: the whole ``gspo serve`` process; engine: this process during its
phases), whose ratio is the throughput ratio whenever generation is CPU-bound, and the
server's own measure of its time outside the engine (from its Prometheus histograms), and
where the engine thread's wall time went, both ways: on a core, waiting for a core (the
machine's other load), or asleep (in the server, under load: waiting for the GIL the event
loop holds). On a
small machine the client and redis-server share the cores with the server (in a deployment
they do not): their CPU per request is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.lib.lean_http import LeanClient  # noqa: E402
from benchmarks.lib.proc_clocks import (  # noqa: E402
    busiest_since,
    cpu_clock,
    sched_clocks,
    thread_cpu_ticks,
)
from benchmarks.lib.serving_args import model_dir, serving_parser  # noqa: E402
from gspo_rl.contract.net import free_port  # noqa: E402
from gspo_rl.server.engines.base import SamplingParams  # noqa: E402

API_KEY = "bench-key"
COUNTERS = ("decode_steps", "prefills", "coalesce_waits",  # engine counters per phase
            "coalesce_wait_seconds")


def wait_until(check: Callable[[], bool], proc: subprocess.Popen, what: str,
               timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready within {timeout}s")
        time.sleep(0.1)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def redis_server(workdir: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found: run scripts/setup.sh")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _port_open(port), proc, "redis-server", 20)
        yield f"redis://127.0.0.1:{port}/0", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def http_server(model: Path, redis_url: str, args: argparse.Namespace
                ) -> Iterator[tuple[str, int]]:
    port = free_port()
    cmd = [sys.executable, "-m", "gspo_rl.cli", "serve", "--model", str(model), "--port",
           str(port), "--redis-url", redis_url, "--max-tokens", str(2 * args.max_tokens),
           "--max-batch-size", str(args.max_batch_size), "--device", args.device,
           "--dtype", args.dtype,
           "--log-level", "warning", "--no-admission"]  # no learner: nothing is trained
    env = {**os.environ, "GSPO_API_KEY": API_KEY}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(url), proc, "gspo serve")
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def make_prompts(n: int, prompt_len: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(n)]


@dataclass
class Phase:
    tokens: int
    requests: int
    wall_s: float
    # CPU seconds: "serving" (the serving process), "client", "redis", "loop"; and the engine
    # thread's "eng_on_cpu" / "eng_run_queue" seconds (on a core / waiting for one)
    cpu_s: dict[str, float]
    latency_s: float  # mean per request
    engine: dict[str, float] = field(default_factory=dict)  # engine counters' increase

    @property
    def tps(self) -> float:
        return self.tokens / self.wall_s

    @property
    def cpu_per_token(self) -> float:
        return self.cpu_s["serving"] / self.tokens


async def run_load(call: Callable[[int], Awaitable[int]], ids: list[int], concurrency: int,
                   clocks: dict[str, Callable[[], float]],
                   counters: Callable[[], Awaitable[dict[str, float]]]) -> Phase:
    """``concurrency`` workers share the requests ``ids``; ``counters``: the engine's."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in ids:
        queue.put_nowait(i)
    tokens, latencies = 0, []

    async def worker() -> None:
        nonlocal tokens
        while not queue.empty():
            i = queue.get_nowait()
            t0 = time.perf_counter()
            n = await call(i)
            latencies.append(time.perf_counter() - t0)
            tokens += n

    before = await counters()
    cpu0, start = {k: c() for k, c in clocks.items()}, time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    used = {k: c() - cpu0[k] for k, c in clocks.items()}
    after = await counters()
    return Phase(tokens, len(ids), wall, used, statistics.fmean(latencies),
                 {k: after[k] - before.get(k, 0.0) for k in COUNTERS if k in after})


async def paired(first: Callable[[], Awaitable[Phase]], second: Callable[[], Awaitable[Phase]],
                 swap: bool) -> tuple[Phase, Phase]:
    """Runs both measurements back to back (order alternating between calls, so a drift in
    the machine's load hits both alike); returns them in (first, second) order."""
    if swap:
        b = await second()
        return await first(), b
    a = await first()
    return a, await second()


@dataclass
class Results:
    c1: list[tuple[Phase, Phase]]  # (engine, server) pairs, one request each
    fixed: list[tuple[Phase, Phase]]  # N in flight, every request max_tokens long
    mixed: list[tuple[Phase, Phase]]  # N in flight, lengths spread around max_tokens
    overhead_s: float  # mean in-server time outside the engine per request


def request_lengths(n: int, mean: int, kind: str) -> list[int]:
    """"fixed": all ``mean`` (requests start and end together, in waves); "mixed": uniform
    in [mean/2, 3*mean/2] (seeded), as RL rollouts end at different lengths."""
    if kind == "fixed":
        return [mean] * n
    rng = random.Random(1)
    return [rng.randint(mean // 2, 3 * mean // 2) for _ in range(n)]


async def bench(model: Path, url: str, server_pid: int, redis_pid: int,
                args: argparse.Namespace) -> Results:
    """Pairs (engine, server) at c=1 and at c=N, plus the server's in-server overhead."""
    import torch

    from gspo_rl.server.engines.hf.engine import HFEngine

    engine = HFEngine(str(model), max_batch_size=args.max_batch_size, device=args.device,
                      dtype=getattr(torch, args.dtype))
    await engine.start()
    n_req = args.concurrency * args.waves
    n_all = max(args.pairs_1, n_req, 4)  # the warm-up sends 4, the c=1 pairs pairs_1
    prompts = make_prompts(n_all, args.prompt_len, 900)
    engine_clocks = {"serving": cpu_clock(None)}
    server_clocks = {"serving": cpu_clock(server_pid), "client": cpu_clock(None),
                     "redis": cpu_clock(redis_pid),  # the server's event loop: its main thread
                     "loop": cpu_clock(server_pid, server_pid)}
    lengths = request_lengths(n_all, args.max_tokens, "fixed")

    async def direct(i: int) -> int:
        params = SamplingParams(max_tokens=lengths[i], temperature=1.0, seed=i)
        return len((await engine.generate(prompts[i], params)).token_ids)

    lean = LeanClient(url, {"Authorization": f"Bearer {API_KEY}"})
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        async def served(i: int) -> int:
            payload = await lean.post_json("/v1/completions", {
                "model": model.name, "prompt": prompts[i], "max_tokens": lengths[i],
                "temperature": 1.0, "seed": i, "ignore_eos": True})
            found = LeanClient.USAGE.search(payload)
            if found is None:
                raise RuntimeError(f"no usage in {payload[:300]!r}")
            return int(found.group(1))

        async def engine_counters() -> dict[str, float]:
            return engine.stats().extra

        async def server_counters() -> dict[str, float]:
            return engine_stats((await http.get("/metrics")).text)

        def both(ids: list[int], c: int, swap: bool) -> Awaitable[tuple[Phase, Phase]]:
            return paired(lambda: run_load(direct, ids, c, engine_clocks, engine_counters),
                          lambda: run_load(served, ids, c, server_clocks, server_counters),
                          swap)

        # warm-up: a few requests, then on a GPU a whole c=N phase each way (there the first
        # batches of a new size ran several times slower: BENCHMARKS.md, "On an H100")
        # the engine threads, both ways: the busiest thread of each process in the warm-up
        ticks = {pid: thread_cpu_ticks(pid) for pid in (os.getpid(), server_pid)}
        await both(list(range(4)), 4, False)
        for pid, clocks in ((os.getpid(), engine_clocks), (server_pid, server_clocks)):
            thread = busiest_since(pid, ticks[pid])
            clocks.update({f"eng_{k}": c for k, c in sched_clocks(pid, thread).items()})
        if args.device != "cpu":
            await both(list(range(n_req)), args.concurrency, False)
        res = Results(c1=[], fixed=[], mixed=[], overhead_s=0.0)
        for i in range(args.pairs_1):  # c=1: one request each way, back to back
            res.c1.append(await both([i], 1, swap=i % 2 == 1))
        for r in range(2 * args.rounds):  # c=N: one phase each way, back to back
            kind = "fixed" if r % 2 == 0 else "mixed"
            lengths[:n_req] = request_lengths(n_req, args.max_tokens, kind)
            e, s = await both(list(range(n_req)), args.concurrency, swap=(r // 2) % 2 == 1)
            getattr(res, kind).append((e, s))
            print(f"c={args.concurrency} {kind} round {r // 2 + 1}: tok/s engine {e.tps:.0f} "
                  f"server {s.tps:.0f}; CPU ms/token engine {e.cpu_per_token * 1e3:.3f} "
                  f"server {s.cpu_per_token * 1e3:.3f}", flush=True)
        res.overhead_s = in_server_overhead((await http.get("/metrics")).text)
    await lean.close()
    await engine.shutdown()
    return res


def engine_stats(metrics_text: str) -> dict[str, float]:
    """The engine's counters as ``/metrics`` exports them (``gspo_engine_stat``)."""
    found = re.findall(r'^gspo_engine_stat\{name="(\w+)"\} (\S+)$', metrics_text, re.M)
    return {name: float(value) for name, value in found}


def in_server_overhead(metrics_text: str) -> float:
    """Mean seconds a /v1/completions request spent in the server outside the engine
    (parsing, checks, Redis writes, response), from the server's own histograms: a figure
    that other processes' load barely moves, unlike the end-to-end ratios."""
    values = {}
    for line in metrics_text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)

    def mean(metric: str, route: str) -> float:
        label = f'{{route="{route}"}}'
        return values[f"{metric}_sum{label}"] / values[f"{metric}_count{label}"]

    return (mean("gspo_http_request_seconds", "/v1/completions")
            - mean("gspo_generation_seconds", "completions"))


def _verdict(ok: bool) -> str:
    return "OK" if ok else "MISSED"


def _cpu_split(pairs: list[tuple[Phase, Phase]]) -> tuple[float, float, float]:
    """Medians of the CPU ms per request: the direct engine's process, the server's event
    loop (main thread) and the server's other threads (the engine's)."""
    med = statistics.median
    return (med(e.cpu_s["serving"] / e.requests * 1e3 for e, _ in pairs),
            med(s.cpu_s["loop"] / s.requests * 1e3 for _, s in pairs),
            med((s.cpu_s["serving"] - s.cpu_s["loop"]) / s.requests * 1e3 for _, s in pairs))


def _thread_shares(phases: list[Phase]) -> tuple[float, float, float]:
    """Medians of the engine thread's share of each phase's wall time on a core, waiting for
    one, and waiting in the engine's coalescing window (it sleeps there by design: the rest of
    its sleep, under load, is waiting for the GIL)."""
    med = statistics.median
    return (med(ph.cpu_s["eng_on_cpu"] / ph.wall_s for ph in phases),
            med(ph.cpu_s["eng_run_queue"] / ph.wall_s for ph in phases),
            med(ph.engine.get("coalesce_wait_seconds", 0.0) / ph.wall_s for ph in phases))


def report(res: Results, args: argparse.Namespace) -> None:
    n, med = args.concurrency, statistics.median
    lat = [s.latency_s / e.latency_s for e, s in res.c1]
    e1 = med(e.tps for e, _ in res.c1)
    print(f"\nmedians of paired ratios ({len(res.c1)} pairs at c=1, {len(res.fixed)} per "
          f"workload at c={n}; max_tokens {args.max_tokens}, prompt {args.prompt_len} tokens):")
    print(f"  c=1  latency server/engine: {med(lat):.3f} (goal <= 1.05) "
          f"{_verdict(med(lat) <= 1.05)}  [pairs {min(lat):.3f}..{max(lat):.3f}; engine "
          f"{med(e.latency_s for e, _ in res.c1):.3f}s/request]")
    for kind in ("fixed", "mixed"):
        pairs = getattr(res, kind)
        tput = [s.tps / e.tps for e, s in pairs]
        cpu = [e.cpu_per_token / s.cpu_per_token for e, s in pairs]
        print(f"  c={n} {kind}: tokens/s server/engine {med(tput):.3f} (goal >= 0.95) "
              f"{_verdict(med(tput) >= 0.95)}  [pairs {min(tput):.3f}..{max(tput):.3f}; "
              f"engine {med(e.tps for e, _ in pairs):.0f} tok/s]; CPU per token "
              f"engine/server {med(cpu):.3f} [{min(cpu):.3f}..{max(cpu):.3f}]")
        per_req = _cpu_split(pairs)
        print(f"    CPU per request (medians): engine alone {per_req[0]:.2f} ms; server: event "
              f"loop thread {per_req[1]:.2f} ms + its other threads (the engine's) "
              f"{per_req[2]:.2f} ms")
        (d_cpu, d_queue, d_win), (s_cpu, s_queue, s_win) = (
            _thread_shares([ph[i] for ph in pairs]) for i in (0, 1))
        print(f"    engine thread, share of the phase's wall time (medians): direct on a core "
              f"{d_cpu:.3f}, waiting for a core {d_queue:.3f}, in coalescing windows "
              f"{d_win:.3f}; server on a core {s_cpu:.3f}, waiting for a core {s_queue:.3f}, "
              f"asleep {1 - s_cpu - s_queue:.3f} (in coalescing windows {s_win:.3f}, the rest "
              f"waiting for the GIL)")
        sides = ([e for e, _ in pairs], [s for _, s in pairs])
        per = {k: [med(ph.engine.get(k, 0.0) for ph in side) for side in sides]
               for k in COUNTERS}
        print(f"    engine per phase, direct / server (medians): decode steps "
              f"{per['decode_steps'][0]:.0f} / {per['decode_steps'][1]:.0f}, prefills "
              f"{per['prefills'][0]:.0f} / {per['prefills'][1]:.0f}, coalescing windows "
              f"{per['coalesce_waits'][0]:.0f} / {per['coalesce_waits'][1]:.0f}")
    en = med(e.tps for e, _ in res.fixed)
    served = [s for pairs in (res.fixed, res.mixed) for _, s in pairs]
    per_req = {k: sum(s.cpu_s[k] for s in served) / sum(s.requests for s in served) * 1e3
               for k in ("client", "redis")}
    engine_req = med(e.cpu_s["serving"] / e.requests for e, _ in res.mixed) * 1e3
    print(f"  CPU per request on the same cores during server phases: load-generating client "
          f"{per_req['client']:.1f} ms, redis-server {per_req['redis']:.1f} ms (engine alone: "
          f"{engine_req:.1f} ms per mixed request)")
    print(f"  in-server time outside the engine: {res.overhead_s * 1e3:.1f} ms per request, mean "
          f"over every request of the run")
    print(f"  engine batching: {en:.0f} tok/s at c={n} (fixed) vs {e1:.0f} at c=1 = "
          f"{en / e1:.2f}x (goal >= 4) {_verdict(en / e1 >= 4)}")


def main() -> None:
    p = serving_parser(__doc__, max_tokens=128, concurrency=32)
    p.add_argument("--pairs-1", type=int, default=12, help="request pairs at c=1")
    p.add_argument("--waves", type=int, default=2, help="requests per c=N phase / N")
    p.add_argument("--rounds", type=int, default=6, help="phase pairs per c=N workload")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = model_dir(args, Path(tmp))
        with redis_server(Path(tmp)) as (redis_url, redis_pid), \
                http_server(model, redis_url, args) as (url, pid):
            out = asyncio.run(bench(model, url, pid, redis_pid, args))
    report(out, args)


if __name__ == "__main__":
    main()
