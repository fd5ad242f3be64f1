"""The serving process's own CPU per request, against the least an HTTP server can spend.

    .venv/bin/python benchmarks/bench_server_cpu.py [--requests 3000 --rounds 4]

Where generation is CPU-bound and the engine runs in the server's process (the hf engine on a
CPU), every millisecond the event loop spends on a request is a millisecond the engine thread
waits for the GIL (``bench_server.py`` measures that loss). This benchmark measures the
loop's side alone, with no engine CPU beside it, so the number is steadier than a throughput
ratio:

- ours: ``gspo serve``'s app (``gspo_rl.server.api.app.create_app``: FastAPI, the key check, body
checks,
  admission, the completion, recording every group in a real Redis, the response) with an
  engine that samples nothing (``benchmarks.lib.instant_engine``: each request ends after a
  random delay, so they end one by one as mixed-length rollouts do);
- baseline (the floor): a bare ASGI app on the same uvicorn (uvloop, httptools) that reads
  the body, parses its JSON, waits the same delays and answers a body of the same size.

Both run as their own processes, both up at once, driven in turns (order alternating) by the
same lean keep-alive client: ``--requests`` ``POST /v1/completions`` (32 token-id prompt,
``max_tokens`` uniform in [64, 192]) at ``--concurrency`` in flight. Printed: CPU per request
of each process and of its main thread (the event loop), the median of the rounds' ratios
ours/floor, and ours minus floor: what the app itself costs per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_server import _healthy, make_prompts, redis_server, wait_until  # noqa: E402
from benchmarks.lib.lean_http import LeanClient  # noqa: E402
from benchmarks.lib.proc_clocks import cpu_clock  # noqa: E402
from gspo_rl.contract.net import free_port  # noqa: E402

API_KEY = "bench-key"
SIDES = ("ours", "floor")


def serve_ours(model: str, redis_url: str, port: int, delay_s: float) -> None:
    from benchmarks.lib.instant_engine import InstantEngine
    from gspo_rl.server.api.app import create_app
    from gspo_rl.server.config import ServerSettings
    from gspo_rl.server.run import run_server

    settings = ServerSettings(model=model, redis_url=redis_url, port=port, api_key=API_KEY,
                              admission=False)  # no learner runs here
    run_server(create_app(settings, InstantEngine(model, delay_s)), host="127.0.0.1",
               port=port, log_level="warning")


def floor_app(delay_s: float, body_bytes: int):  # noqa: ANN201 - an ASGI callable
    """Reads and parses the body, waits as the instant engine does, answers ``body_bytes``."""
    rng = random.Random(0)
    filler = json.dumps({"id": "cmpl-0", "object": "text_completion", "text": ""})
    answer = (filler[:-1] + " " * max(0, body_bytes - len(filler)) + "}").encode()

    async def app(scope: dict, receive, send) -> None:  # noqa: ANN001 - ASGI
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/health":
            await _answer(send, b"{}")
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        json.loads(body)
        await asyncio.sleep(delay_s * rng.uniform(0.5, 1.5))
        await _answer(send, answer)

    return app


async def _answer(send, body: bytes) -> None:  # noqa: ANN001 - ASGI
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def serve_floor(port: int, delay_s: float, body_bytes: int) -> None:
    import uvicorn

    uvicorn.run(floor_app(delay_s, body_bytes), host="127.0.0.1", port=port,
                log_level="warning")


@contextmanager
def server(side: str, model: str, redis_url: str, args: argparse.Namespace,
           body_bytes: int = 0) -> Iterator[tuple[str, int]]:
    port = free_port()
    cmd = [sys.executable, __file__, "--serve", side, "--model", model, "--redis-url",
           redis_url, "--port", str(port), "--delay-ms", str(args.delay_ms),
           "--body-bytes", str(body_bytes)]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(url), proc, f"the {side} server")
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def phase(url: str, pid: int, model: str, n: int, concurrency: int,
                seed: int) -> tuple[float, float, int]:
    """CPU seconds per request of the process and of its main thread; the last body's size."""
    lean = LeanClient(url, {"Authorization": f"Bearer {API_KEY}"})
    prompts, rng = make_prompts(256, 32, 900), random.Random(seed)
    left, size = [n], [0]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            i = rng.randrange(256)
            payload = await lean.post_json("/v1/completions", {
                "model": model, "prompt": prompts[i], "max_tokens": rng.randint(64, 192),
                "temperature": 1.0, "seed": i, "ignore_eos": True})
            size[0] = len(payload)

    process, loop = cpu_clock(pid), cpu_clock(pid, pid)
    p0, l0 = process(), loop()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    used, loop_used = process() - p0, loop() - l0
    await lean.close()
    return used / n, loop_used / n, size[0]


async def measure(urls: dict[str, tuple[str, int]], model: str,
                  args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {s: [] for s in SIDES}
    for side in SIDES:  # warm-up: imports, caches, connections
        await phase(*urls[side], model, min(args.requests, 300), args.concurrency, 99)
    for r in range(args.rounds):
        for side in (SIDES if r % 2 == 0 else SIDES[::-1]):
            cpu, loop, _ = await phase(*urls[side], model, args.requests, args.concurrency, r)
            out[side].append((cpu, loop))
            print(f"round {r + 1} {side}: {1e3 * cpu:.3f} ms CPU per request "
                  f"(main thread {1e3 * loop:.3f} ms)", flush=True)
    return out


def report(res: dict[str, list[tuple[float, float]]], args: argparse.Namespace) -> None:
    ours, floor = res["ours"], res["floor"]
    # a clock tick is 10 ms: a tiny run may see none on the floor's side
    ratios = [o[0] / f[0] for o, f in zip(ours, floor, strict=True) if f[0] > 0]
    extra = [o[0] - f[0] for o, f in zip(ours, floor, strict=True)]
    med = statistics.median
    print(f"\nmedians over {args.rounds} rounds of {args.requests} requests at "
          f"c={args.concurrency}:")
    print(f"  ours:  {1e3 * med(o[0] for o in ours):.3f} ms CPU per request "
          f"(main thread {1e3 * med(o[1] for o in ours):.3f})")
    print(f"  floor: {1e3 * med(f[0] for f in floor):.3f} ms CPU per request "
          f"(main thread {1e3 * med(f[1] for f in floor):.3f})")
    spread = (f"{med(ratios):.2f} [{min(ratios):.2f}..{max(ratios):.2f}]" if ratios else
              "n/a (the floor used no clock tick: raise --requests)")
    print(f"  CPU per request ratio ours/floor: {spread}; the app's own cost (ours - floor): "
          f"{1e3 * med(extra):.3f} ms per request")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=3000, help="per phase")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--delay-ms", type=float, default=25.0,
                   help="the instant engine's mean time per request")
    p.add_argument("--serve", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--redis-url", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--body-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve == "ours":
        serve_ours(args.model, args.redis_url, args.port, args.delay_ms / 1e3)
        return
    if args.serve == "floor":
        serve_floor(args.port, args.delay_ms / 1e3, args.body_bytes)
        return
    from gspo_rl.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        model = str(make_tiny_model(Path(tmp) / "tiny", num_layers=1, hidden_size=64))
        redis_url, _ = stack.enter_context(redis_server(Path(tmp)))
        ours = stack.enter_context(server("ours", model, redis_url, args))
        # the floor answers as many bytes as ours does (measured on one request)
        body_bytes = asyncio.run(phase(*ours, Path(model).name, 1, 1, 0))[2]
        floor = stack.enter_context(server("floor", model, redis_url, args, body_bytes))
        start = time.monotonic()
        res = asyncio.run(measure({"ours": ours, "floor": floor}, Path(model).name, args))
        report(res, args)
        print(f"  ({time.monotonic() - start:.0f} s; response body {body_bytes} bytes)")


if __name__ == "__main__":
    main()
