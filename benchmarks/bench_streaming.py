"""Time to first text, streamed against non-streamed: what incremental streaming buys a client.

    .venv/bin/python benchmarks/bench_streaming.py [--max-tokens 256 --concurrency 8 --pairs 6]

One ``gspo serve`` (hf engine, or ``--engine vllm``; real Redis recording every rollout) in a
subprocess, driven over HTTP. Every request is ``POST /v1/completions`` with a token-id
prompt, a seed and ``ignore_eos``, so both ways generate exactly ``max_tokens`` tokens.
Paired phases, the order alternating: ``concurrency`` non-streamed requests at once, then the
same requests streamed (same seeds), or the reverse.

Baseline: the non-streamed request, whose text arrives with its response (time to first text =
its latency). Measured: the streamed request's time to its first chunk with text, and to its
``[DONE]``. Prints the median over requests of each phase, and the medians over pairs of the
ratios streamed/non-streamed: time to first text (goal: well below 1, about a prompt's prefill
and a few tokens over the whole completion) and total time (the cost of streaming; goal about
1.0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_server import (  # noqa: E402
    API_KEY,
    http_server,
    make_prompts,
    redis_server,
)
from benchmarks.lib.proc_clocks import cpu_clock  # noqa: E402
from benchmarks.lib.serving_args import model_dir, serving_parser  # noqa: E402

Times = tuple[float, float]  # (first text, end) in seconds


async def plain(client: httpx.AsyncClient, body: dict) -> Times:
    start = time.perf_counter()
    resp = await client.post("/v1/completions", json=body)
    resp.raise_for_status()
    took = time.perf_counter() - start
    return took, took


FIRST_TEXT = re.compile(rb'"text":"[^"]')


async def streamed(url: str, body: dict) -> Times:
    """A lean streaming client (raw HTTP/1.1 over asyncio streams; httpx's line iterator
    costs the shared cores ~20x the CPU of a non-streamed request): times the first chunk
    with text and the ``[DONE]`` event."""
    u = httpx.URL(url)
    data = json.dumps({**body, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {u.host}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(data)}\r\nAuthorization: Bearer "
            f"{API_KEY}\r\nConnection: close\r\n\r\n").encode()
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(u.host, u.port)
    writer.write(head + data)
    first, seen = None, b""
    try:
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"{status!r}: {(await reader.read(300))!r}")
        while b"data: [DONE]" not in seen[-64:]:
            got = await reader.read(65536)
            if not got:
                raise RuntimeError("the stream ended before [DONE]")
            seen = seen[-64:] + got
            if first is None and FIRST_TEXT.search(got):
                first = time.perf_counter() - start
    finally:
        writer.close()
    end = time.perf_counter() - start
    return (end if first is None else first), end


async def phase(client: httpx.AsyncClient, bodies: list[dict], stream: bool) -> list[Times]:
    if stream:
        return list(await asyncio.gather(*(streamed(str(client.base_url), b) for b in bodies)))
    return list(await asyncio.gather(*(plain(client, b) for b in bodies)))


async def cpu_phase(client: httpx.AsyncClient, bodies: list[dict], stream: bool,
                    clocks: dict[str, Callable[[], float]]) -> tuple[list[Times], dict]:
    """A phase and the CPU seconds each process (server, this client) used in it."""
    before = {k: c() for k, c in clocks.items()}
    times = await phase(client, bodies, stream)
    return times, {k: c() - before[k] for k, c in clocks.items()}


def _ratio(a: float, b: float) -> float:
    """a / b; NaN when b is 0 (a phase shorter than the CPU clock's tick: tiny sizes)."""
    return a / b if b > 0 else float("nan")


async def bench(url: str, model: str, server_pid: int,
                args: argparse.Namespace) -> dict[str, list[float]]:
    prompts = make_prompts(args.concurrency, args.prompt_len, 500)
    clocks = {"server": cpu_clock(server_pid), "client": cpu_clock(None)}
    out: dict[str, list[float]] = {k: [] for k in ("ttft_s", "ttft_p", "end_s", "end_p",
                                                    "ttft_ratio", "end_ratio", "server_cpu",
                                                    "client_cpu", "server_us_s", "server_us_p")}
    async with httpx.AsyncClient(base_url=url, timeout=600,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as client:
        warm = [{"model": model, "prompt": p, "max_tokens": 4, "ignore_eos": True} for p in prompts]
        await phase(client, warm, False)
        await phase(client, warm, True)
        for pair in range(args.pairs):
            bodies = [{"model": model, "prompt": p, "max_tokens": args.max_tokens,
                       "ignore_eos": True, "seed": 1000 * pair + i}
                      for i, p in enumerate(prompts)]
            order = (True, False) if pair % 2 else (False, True)
            got, cpu = {}, {}
            for s in order:
                got[s], cpu[s] = await cpu_phase(client, bodies, s, clocks)
            out["server_cpu"].append(_ratio(cpu[True]["server"], cpu[False]["server"]))
            tokens = args.max_tokens * len(bodies)
            out["server_us_s"].append(cpu[True]["server"] / tokens * 1e6)
            out["server_us_p"].append(cpu[False]["server"] / tokens * 1e6)
            out["client_cpu"].append(_ratio(cpu[True]["client"], cpu[False]["client"]))
            ttft_s = statistics.median(t for t, _ in got[True])
            ttft_p = statistics.median(t for t, _ in got[False])
            end_s = statistics.median(e for _, e in got[True])
            end_p = statistics.median(e for _, e in got[False])
            for key, value in (("ttft_s", ttft_s), ("ttft_p", ttft_p), ("end_s", end_s),
                               ("end_p", end_p), ("ttft_ratio", ttft_s / ttft_p),
                               ("end_ratio", end_s / end_p)):
                out[key].append(value)
    return out


def report(res: dict[str, list[float]], args: argparse.Namespace) -> None:
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"{args.engine} engine: completions of {args.max_tokens} tokens, "
          f"{args.concurrency} in flight, "
          f"{args.pairs} pairs (medians)")
    print(f"  non-streamed: first text {med['ttft_p'] * 1e3:8.1f} ms   "
          f"end {med['end_p'] * 1e3:8.1f} ms")
    print(f"  streamed:     first text {med['ttft_s'] * 1e3:8.1f} ms   "
          f"end {med['end_s'] * 1e3:8.1f} ms")
    print(f"time-to-first-text ratio streamed/non-streamed: {med['ttft_ratio']:.3f} "
          f"(pairs: {', '.join(f'{r:.3f}' for r in res['ttft_ratio'])})")
    print(f"total-time ratio streamed/non-streamed: {med['end_ratio']:.3f} "
          f"(pairs: {', '.join(f'{r:.3f}' for r in res['end_ratio'])})")
    print(f"server CPU per token: non-streamed {med['server_us_p']:.0f} us, streamed "
          f"{med['server_us_s']:.0f} us")
    print(f"CPU ratio streamed/non-streamed: server {med['server_cpu']:.3f}, "
          f"client {med['client_cpu']:.3f}")


def main() -> None:
    p = serving_parser(__doc__, max_tokens=256, concurrency=8)
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = model_dir(args, Path(tmp))
        with redis_server(Path(tmp)) as (redis_url, _):
            if args.engine == "hf":
                with http_server(model, redis_url, args) as (url, pid):
                    out = asyncio.run(bench(url, model.name, pid, args))
            else:  # the vllm engine: the CPU figures are the front process's only
                from benchmarks.lib.vllm_servers import MODEL_NAME, ours

                args.max_num_seqs, args.max_model_len = args.max_batch_size, 1024
                with ours(model, redis_url, args, Path(tmp) / "serve.log") as srv:
                    out = asyncio.run(bench(srv.url, MODEL_NAME, srv.proc.pid, args))
    report(out, args)


if __name__ == "__main__":
    main()
