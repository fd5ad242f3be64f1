"""Time to first text, streamed against non-streamed: what incremental streaming buys a client.

    .venv/bin/python benchmarks/bench_streaming.py [--max-tokens 256 --concurrency 8 --pairs 6]

One ``gspo serve`` (hf engine, real Redis recording every rollout) in a subprocess, driven over
HTTP by httpx. Every request is ``POST /v1/completions`` with a token-id prompt, a seed and
``ignore_eos``, so both ways generate exactly ``max_tokens`` tokens. Paired phases, the order
alternating: ``concurrency`` non-streamed requests at once, then the same requests streamed
(same seeds), or the reverse.

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
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_server import API_KEY, http_server, make_prompts, redis_server  # noqa: E402

Times = tuple[float, float]  # (first text, end) in seconds


async def plain(client: httpx.AsyncClient, body: dict) -> Times:
    start = time.perf_counter()
    resp = await client.post("/v1/completions", json=body)
    resp.raise_for_status()
    took = time.perf_counter() - start
    return took, took


async def streamed(client: httpx.AsyncClient, body: dict) -> Times:
    start = time.perf_counter()
    first = None
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data: {"):
                choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                if choice.get("text"):
                    first = time.perf_counter() - start
            if line == "data: [DONE]":
                break
    end = time.perf_counter() - start
    return (end if first is None else first), end


async def phase(client: httpx.AsyncClient, bodies: list[dict], stream: bool) -> list[Times]:
    call = streamed if stream else plain
    return list(await asyncio.gather(*(call(client, b) for b in bodies)))


async def bench(url: str, args: argparse.Namespace) -> dict[str, list[float]]:
    prompts = make_prompts(args.concurrency, args.prompt_len, 500)
    out: dict[str, list[float]] = {k: [] for k in ("ttft_s", "ttft_p", "end_s", "end_p",
                                                    "ttft_ratio", "end_ratio")}
    async with httpx.AsyncClient(base_url=url, timeout=600,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as client:
        warm = [{"prompt": p, "max_tokens": 4, "ignore_eos": True} for p in prompts]
        await phase(client, warm, False)
        await phase(client, warm, True)
        for pair in range(args.pairs):
            bodies = [{"prompt": p, "max_tokens": args.max_tokens, "ignore_eos": True,
                       "seed": 1000 * pair + i} for i, p in enumerate(prompts)]
            order = (True, False) if pair % 2 else (False, True)
            got = {s: await phase(client, bodies, s) for s in order}
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
    print(f"completions of {args.max_tokens} tokens, {args.concurrency} in flight, "
          f"{args.pairs} pairs (medians)")
    print(f"  non-streamed: first text {med['ttft_p'] * 1e3:8.1f} ms   "
          f"end {med['end_p'] * 1e3:8.1f} ms")
    print(f"  streamed:     first text {med['ttft_s'] * 1e3:8.1f} ms   "
          f"end {med['end_s'] * 1e3:8.1f} ms")
    print(f"time-to-first-text ratio streamed/non-streamed: {med['ttft_ratio']:.3f} "
          f"(pairs: {', '.join(f'{r:.3f}' for r in res['ttft_ratio'])})")
    print(f"total-time ratio streamed/non-streamed: {med['end_ratio']:.3f} "
          f"(pairs: {', '.join(f'{r:.3f}' for r in res['end_ratio'])})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="model dir (default: a fresh tiny model)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=2, help="tiny model's layers")
    p.add_argument("--hidden", type=int, default=128, help="tiny model's hidden size")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from server.tiny_model import make_tiny_model

            model = make_tiny_model(Path(tmp) / "tiny", num_layers=args.layers,
                                    hidden_size=args.hidden)
        with redis_server(Path(tmp)) as (redis_url, _), \
                http_server(model, redis_url, args) as (url, _):
            out = asyncio.run(bench(url, args))
    report(out, args)


if __name__ == "__main__":
    main()
