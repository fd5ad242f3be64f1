"""verifiers environments: episodes per second with harness programs started by the fork
server (``runtime_python=prefork``, the default) against a fresh interpreter per program
(``this``), in the same run.

    .venv/bin/python benchmarks/bench_verifiers.py [--groups 12 --repeats 3]

A real rollout server (``gspo serve``: hf engine on a tiny model made on the spot, real Redis,
no learner: admission and the ready queue's bound off) and the example taskset
``examples/verifiers/gspo_alphabet`` (single-turn, verifiers' ``null`` chat harness, replies
of ``--max-tokens`` tokens): ``--groups`` groups of ``--group-size`` episodes,
``--concurrency`` groups at a time, per mode and repeat (the modes alternate first). Printed:
episodes/s of each and their ratio prefork/this (median of the repeats); with
``--multi-turn`` the test suite's multi-turn game instead (its harness relaunched every turn).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODES = ("prefork", "this")


def spec(args: argparse.Namespace) -> str:
    if args.multi_turn:
        return f"verifiers:{ROOT / 'tests/clients/adapters/verifiers_envs/gspo_vf_guess'}"
    return f"verifiers:{ROOT / 'examples/verifiers/gspo_alphabet'}"


async def phase(url: str, mode: str, args: argparse.Namespace) -> float:
    """``--groups`` groups with harness programs started as ``mode``: episodes/s."""
    from benchmarks.bench_server import API_KEY
    from gspo_rl.client.client import AsyncGSPOClient
    from gspo_rl.client.loading import load_environment
    from gspo_rl.client.runner import arun_groups

    env = load_environment(spec(args), args={
        "group_size": args.group_size, "harness": "null", "runtime_python": mode,
        "sampling": {"max_tokens": args.max_tokens}})
    async with AsyncGSPOClient(url, api_key=API_KEY) as client, env.serving():
        await arun_groups(env, client, 1, concurrency=1)  # the fork server, caches
        t0 = time.monotonic()
        out = await arun_groups(env, client, args.groups, concurrency=args.concurrency)
        seconds = time.monotonic() - t0
    return sum(len(o.rewards) for o in out) / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=12)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--multi-turn", action="store_true")
    args = p.parse_args()
    from benchmarks.bench_server import http_server, redis_server
    from gspo_rl.tiny_model import make_tiny_model

    os.environ["GSPO_MAX_READY_GROUPS"] = "0"  # no learner reads the groups: no bound
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "tiny")
        serve = argparse.Namespace(max_tokens=args.max_tokens, max_batch_size=64,
                                   device="cpu", dtype="float32")
        with redis_server(Path(tmp)) as (redis_url, _), \
                http_server(model, redis_url, serve) as (url, _):
            for r in range(args.repeats):
                for mode in MODES[r % 2:] + MODES[:r % 2]:
                    rates[mode].append(asyncio.run(phase(url, mode, args)))
                    print(f"repeat {r + 1} {mode:>7}: {rates[mode][-1]:.2f} episodes/s "
                          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    ratios = [a / b for a, b in zip(rates["prefork"], rates["this"], strict=True)]
    print(f"\nepisodes/s, median of {args.repeats}: " + ", ".join(
        f"{m} {statistics.median(v):.2f}" for m, v in rates.items()))
    print(f"ratio prefork/this (episodes/s): {statistics.median(ratios):.2f} "
          f"[{min(ratios):.2f}..{max(ratios):.2f}]", flush=True)


if __name__ == "__main__":
    main()
