"""Legitimate reward posts while keyless senders flood the server with large bodies, with the key
checked before the body is read (now) and after FastAPI has read and parsed it (before issue 35).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_auth_flood.py [--senders 4 --posts 300]

Two ``gspo serve`` apps (``create_app``, an engine that samples nothing:
``benchmarks.lib.instant_engine``) run as their own processes on one Redis:

- now: the app as it ships (``gspo_rl.server.api.auth.BearerAuthMiddleware`` answers 401
  before a body byte is received);
- before: the same app without that middleware, so the key is checked by the route
  dependencies only, after FastAPI read and parsed the body (the code before issue 35).

Per round and side: ``--senders`` processes-worth of keyless clients (one process, one
connection each) post a ``--mib`` MiB JSON array to ``/v1/rewards`` in a loop, while one
client posts ``--posts`` rewards (with the key) one at a time for rollouts sampled beforehand.
Printed per side: p50 / p99 of the legitimate posts and of a keyless request's 401, and the
ratios before/now; rounds alternate the order of the sides. A quiet phase (no senders) gives
the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

# The senders' process imports nothing heavy (benchmarks.bench_server imports torch): the
# parent's helpers are imported where the parent uses them.

API_KEY = "bench-key"
SIDES = ("now", "before")


def serve(side: str, model: str, redis_url: str, port: int) -> None:
    from benchmarks.lib.instant_engine import InstantEngine
    from gspo_rl.server.api.app import create_app
    from gspo_rl.server.api.auth import BearerAuthMiddleware
    from gspo_rl.server.config import ServerSettings
    from gspo_rl.server.run import run_server

    settings = ServerSettings(model=model, redis_url=redis_url, port=port, api_key=API_KEY,
                              admin_key="bench-admin", admission=False, server_id=side,
                              key_prefix=f"bench-{side}")
    app = create_app(settings, InstantEngine(model, 0.001))
    if side == "before":  # the key checked only by the dependencies, after the parse
        app.user_middleware = [m for m in app.user_middleware
                               if m.cls is not BearerAuthMiddleware]
    run_server(app, host="127.0.0.1", port=port, log_level="warning")


def flood(url: str, senders: int, mib: float, out: str) -> None:
    """Keyless posts of a ``mib`` MiB body in a loop on ``senders`` connections until killed;
    appends each answer's latency (s) to ``out`` as it comes."""
    host, port = url.removeprefix("http://").split(":")
    items = [{"rollout_id": f"r{i:07d}", "reward": 0.5} for i in range(int(mib * 25_000))]
    body = json.dumps(items).encode()
    request = (f"POST /v1/rewards HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
               f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    async def sender(log: list[float]) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        while True:
            t0 = time.perf_counter()
            writer.write(request)
            await writer.drain()
            await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            log.append(time.perf_counter() - t0)

    async def main() -> None:
        log: list[float] = []

        async def dump() -> None:
            while True:
                await asyncio.sleep(0.2)
                with open(out, "a") as f:
                    f.writelines(f"{x}\n" for x in log)
                log.clear()

        await asyncio.gather(dump(), *(sender(log) for _ in range(senders)))

    asyncio.run(main())


@contextmanager
def process(args: list[str]) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, __file__, *args], cwd=REPO,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def rollout_ids(url: str, model: str, n: int) -> list[str]:
    from benchmarks.lib.lean_http import LeanClient

    lean = LeanClient(url, {"Authorization": f"Bearer {API_KEY}"})
    ids: list[str] = []
    while len(ids) < n:
        payload = await lean.post_json("/v1/rollouts", {
            "model": model, "prompt_token_ids": [1, 2, 3], "n": 8, "max_tokens": 2})
        ids += [r["rollout_id"] for r in json.loads(payload)["rollouts"]]
    await lean.close()
    return ids[:n]


async def legit_posts(url: str, ids: list[str]) -> list[float]:
    from benchmarks.lib.lean_http import LeanClient

    lean = LeanClient(url, {"Authorization": f"Bearer {API_KEY}"})
    out = []
    for i, rid in enumerate(ids):
        t0 = time.perf_counter()
        await lean.post_json("/v1/rewards", {"rollout_id": rid, "reward": float(i % 2)})
        out.append(time.perf_counter() - t0)
    await lean.close()
    return out


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def phase(url: str, ids: list[str], args: argparse.Namespace,
          tmp: Path) -> tuple[list[float], list[float]]:
    """Legit latencies with ``args.senders`` flooding (none when 0), and the floods' 401s."""
    from benchmarks.bench_server import wait_until

    if args.senders == 0:
        return asyncio.run(legit_posts(url, ids)), []
    log = tmp / f"flood-{time.monotonic_ns()}.txt"
    log.touch()
    with process(["--flood", url, "--senders", str(args.senders), "--mib", str(args.mib),
                  "--out", str(log)]) as proc:
        wait_until(lambda: len(log.read_text().split()) >= args.senders, proc,
                   "the keyless senders' first answers")
        done = len(log.read_text().split())
        legit = asyncio.run(legit_posts(url, ids))
        time.sleep(0.6)  # the answers during the legit posts are on file
    floods = [float(x) for x in log.read_text().split()][done:]
    return legit, floods


def run(args: argparse.Namespace) -> None:
    from benchmarks.bench_server import _healthy, redis_server, wait_until
    from gspo_rl.contract.net import free_port
    from gspo_rl.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp_dir, ExitStack() as stack:
        tmp = Path(tmp_dir)
        model = str(make_tiny_model(tmp / "tiny", num_layers=1, hidden_size=64))
        redis_url, _ = stack.enter_context(redis_server(tmp))
        urls, procs = {}, {}
        for side in SIDES:  # both start at once (their start-ups overlap), then both answer
            port = free_port()
            procs[side] = stack.enter_context(process(["--serve", side, "--model", model,
                                                       "--redis-url", redis_url, "--port",
                                                       str(port)]))
            urls[side] = f"http://127.0.0.1:{port}"
        for side in SIDES:
            wait_until(lambda u=urls[side]: _healthy(u), procs[side], f"the {side} server")
        name = Path(model).name
        per_phase = args.posts
        ids = {s: asyncio.run(rollout_ids(urls[s], name, per_phase * (2 * args.rounds + 1)))
               for s in SIDES}
        results: dict[str, dict[str, list[list[float]]]] = {
            s: {"quiet": [], "legit": [], "401": []} for s in SIDES}
        quiet = argparse.Namespace(**{**vars(args), "senders": 0})
        for r in range(args.rounds):
            for side in (SIDES if r % 2 == 0 else SIDES[::-1]):
                take = ids[side][:per_phase], ids[side][per_phase:2 * per_phase]
                ids[side] = ids[side][2 * per_phase:]
                results[side]["quiet"].append(phase(urls[side], take[0], quiet, tmp)[0])
                legit, floods = phase(urls[side], take[1], args, tmp)
                results[side]["legit"].append(legit)
                results[side]["401"].append(floods)
                print(f"round {r + 1} {side}: legit p50 {1e3 * pct(legit, 0.5):.1f} ms, "
                      f"p99 {1e3 * pct(legit, 0.99):.1f} ms; keyless 401 p50 "
                      f"{1e3 * pct(floods, 0.5):.1f} ms ({len(floods)} answered)", flush=True)
        report(results, args)


def report(results: dict[str, dict[str, list[list[float]]]], args: argparse.Namespace) -> None:
    med = statistics.median
    print(f"\n{args.senders} keyless senders of {args.mib:g} MiB bodies, {args.posts} "
          f"legitimate reward posts per phase, medians over {args.rounds} rounds:")
    stats = {}
    for side in SIDES:
        r = results[side]
        stats[side] = {k: (med(pct(x, 0.5) for x in r[k]), med(pct(x, 0.99) for x in r[k]))
                       for k in ("quiet", "legit", "401")}
        s = stats[side]
        print(f"  {side:6s}: legit quiet p50 {1e3 * s['quiet'][0]:.1f} / p99 "
              f"{1e3 * s['quiet'][1]:.1f} ms; flooded p50 {1e3 * s['legit'][0]:.1f} / p99 "
              f"{1e3 * s['legit'][1]:.1f} ms; keyless 401 p50 {1e3 * s['401'][0]:.1f} ms")
    now, before = stats["now"], stats["before"]
    print(f"  ratio before/now, flooded legit posts: p50 {before['legit'][0] / now['legit'][0]:.1f}"
          f"x, p99 {before['legit'][1] / now['legit'][1]:.1f}x; keyless 401 p50 "
          f"{before['401'][0] / now['401'][0]:.1f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--senders", type=int, default=4)
    p.add_argument("--mib", type=float, default=7.6, help="size of a keyless body")
    p.add_argument("--posts", type=int, default=300, help="legitimate posts per phase")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--serve", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--redis-url", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--flood", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.model, args.redis_url, args.port)
    elif args.flood:
        flood(args.flood, args.senders, args.mib, args.out)
    else:
        run(args)


if __name__ == "__main__":
    main()
