"""What the HTTP server costs on top of its engine: the same requests, both ways, in one run.

    .venv/bin/python benchmarks/bench_server.py [--max-tokens 128 --concurrency 32 --rounds 3]

Baseline: the hf engine called directly (``engine.generate`` from asyncio, in this process).
Measured: ``gspo serve`` (hf engine, same model, real Redis recording every rollout) in a
subprocess, driven over HTTP (``POST /v1/completions`` with a token-id prompt) by an httpx
client in this process. Every request is ``prompt_len`` token ids, ``max_tokens`` tokens with
``ignore_eos`` and a per-request seed, so both ways generate exactly the same token counts.

Measurements are paired: at c=1 one request each way back to back, at c=N one phase each way
back to back, the order alternating; the reported ratios are medians of the pairs' ratios, so
load from other processes on a shared machine hits both sides of a pair alike.

Prints: latency ratio at 1 request in flight (goal: server <= 1.05x engine), throughput ratio
at N in flight (goal: server >= 0.95x engine tokens/s), and the engine's own batching gain
(tokens/s at N over tokens/s at 1; goal >= 4x).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from server.engines.base import SamplingParams  # noqa: E402

API_KEY = "bench-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
def redis_server(workdir: Path) -> Iterator[str]:
    port = free_port()
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found: run scripts/setup.sh")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _port_open(port), proc, "redis-server", 20)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def http_server(model: Path, redis_url: str, args: argparse.Namespace) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "gspo.cli", "serve", "--model", str(model), "--port",
           str(port), "--redis-url", redis_url, "--max-tokens", str(args.max_tokens),
           "--max-batch-size", str(args.max_batch_size), "--device", args.device,
           "--log-level", "warning"]
    env = {**os.environ, "GSPO_API_KEY": API_KEY}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(url), proc, "gspo serve")
        yield url
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


async def run_load(call: Callable[[int], Awaitable[int]], ids: list[int],
                   concurrency: int) -> tuple[float, float]:
    """``concurrency`` workers share the requests ``ids``; returns (tokens/s, mean seconds
    per request)."""
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

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return tokens / wall, statistics.fmean(latencies)


async def paired(first: Callable[[], Awaitable[float]], second: Callable[[], Awaitable[float]],
                 swap: bool) -> tuple[float, float]:
    """Runs both measurements back to back (order alternating between calls, so a drift in
    the machine's load hits both alike); returns them in (first, second) order."""
    if swap:
        b = await second()
        return await first(), b
    a = await first()
    return a, await second()


async def bench(model: Path, url: str, args: argparse.Namespace) -> dict[str, list[float]]:
    from server.engines.hf import HFEngine

    engine = HFEngine(str(model), max_batch_size=args.max_batch_size, device=args.device)
    await engine.start()
    n_req = args.concurrency * args.waves
    prompts = make_prompts(max(args.pairs_1, n_req), args.prompt_len, 900)

    async def direct(i: int) -> int:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=i)
        return len((await engine.generate(prompts[i], params)).token_ids)

    limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        async def served(i: int) -> int:
            r = await http.post("/v1/completions", json={
                "model": model.name, "prompt": prompts[i], "max_tokens": args.max_tokens,
                "temperature": 1.0, "seed": i, "ignore_eos": True})
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        await run_load(direct, list(range(4)), 4)  # warm-up both
        await run_load(served, list(range(4)), 4)
        out: dict[str, list[float]] = {k: [] for k in ("e1", "s1", "e1t", "eN", "sN")}
        for i in range(args.pairs_1):  # c=1: one request each way, back to back
            (e_tps, e_lat), (_, s_lat) = await paired(
                lambda i=i: run_load(direct, [i], 1), lambda i=i: run_load(served, [i], 1),
                swap=i % 2 == 1)
            out["e1"].append(e_lat)
            out["e1t"].append(e_tps)
            out["s1"].append(s_lat)
        ids = list(range(n_req))
        for r in range(args.rounds):  # c=N: one phase each way, back to back
            (e_tps, _), (s_tps, _) = await paired(
                lambda: run_load(direct, ids, args.concurrency),
                lambda: run_load(served, ids, args.concurrency), swap=r % 2 == 1)
            out["eN"].append(e_tps)
            out["sN"].append(s_tps)
            print(f"c={args.concurrency} round {r + 1}: tok/s engine {e_tps:.0f} server "
                  f"{s_tps:.0f}", flush=True)
        out["overhead"] = [in_server_overhead((await http.get("/metrics")).text)]
    await engine.shutdown()
    return out


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


def report(out: dict[str, list[float]], args: argparse.Namespace) -> None:
    med = {k: statistics.median(v) for k, v in out.items()}
    n = args.concurrency
    lat_pairs = [s / e for s, e in zip(out["s1"], out["e1"], strict=True)]
    tput_pairs = [s / e for s, e in zip(out["sN"], out["eN"], strict=True)]
    lat_ratio, tput_ratio = statistics.median(lat_pairs), statistics.median(tput_pairs)
    batching = med["eN"] / med["e1t"]
    print(f"\nmedians of paired ratios ({args.pairs_1} pairs at c=1, {args.rounds} rounds at "
          f"c={n}; max_tokens {args.max_tokens}, prompt {args.prompt_len} tokens):")
    print(f"  c=1  latency/request: engine {med['e1']:.3f}s  server {med['s1']:.3f}s  "
          f"ratio {lat_ratio:.3f}  (goal <= 1.05) {'OK' if lat_ratio <= 1.05 else 'MISSED'}")
    print(f"  c={n} tokens/s:       engine {med['eN']:.0f}  server {med['sN']:.0f}  "
          f"ratio {tput_ratio:.3f}  (goal >= 0.95) {'OK' if tput_ratio >= 0.95 else 'MISSED'}")
    print(f"  spread of the paired ratios (min..max): c=1 {min(lat_pairs):.3f}.."
          f"{max(lat_pairs):.3f}, c={n} {min(tput_pairs):.3f}..{max(tput_pairs):.3f}")
    print(f"  in-server time outside the engine per request: {med['overhead'] * 1e3:.1f} ms "
          f"({med['overhead'] / med['s1'] * 100:.2f}% of a c=1 request)")
    print(f"  engine batching: {med['eN']:.0f} tok/s at c={n} vs {med['e1t']:.0f} at c=1  "
          f"= {batching:.2f}x  (goal >= 4) {'OK' if batching >= 4 else 'MISSED'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="model dir (default: a fresh tiny model)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--pairs-1", type=int, default=12, help="request pairs at c=1")
    p.add_argument("--waves", type=int, default=1, help="requests per c=N phase / N")
    p.add_argument("--rounds", type=int, default=8, help="phase pairs at c=N")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from server.tiny_model import make_tiny_model

            model = make_tiny_model(Path(tmp) / "tiny")
        with redis_server(Path(tmp)) as redis_url, http_server(model, redis_url, args) as url:
            out = asyncio.run(bench(model, url, args))
    report(out, args)


if __name__ == "__main__":
    main()
