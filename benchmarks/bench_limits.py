"""Cost of the request body checks (``gspo_rl.server.api.limits``) against parsing the same body, in
the same run: the checks run on the event loop, so they must stay a fraction of the JSON parse
FastAPI does anyway.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_limits.py [--ids 1000000] [--repeat 5]

Prints, per body: its size, the parse time (``json.loads``, best of 5), the check time
(``check_request_json`` on the parsed body, best of 5) and check / parse.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from gspo_rl.server.api.limits import check_request_json
from gspo_rl.server.rollouts.limits import check_metadata


class _Request:
    """What ``check_request_json`` reads of a Starlette request: the raw and parsed body."""

    method = "POST"

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.parsed = json.loads(raw)

    async def body(self) -> bytes:
        return self.raw

    async def json(self) -> Any:
        return self.parsed


def best(fn: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bodies(n_ids: int) -> dict[str, Any]:
    return {
        "chat, 8 messages": {"model": "m", "max_tokens": 64,
                             "messages": [{"role": "user", "content": "hello " * 50}] * 8},
        "chat, 200 messages, \\u escapes": {"model": "m", "messages": [
            {"role": "user", "content": "héllo 🙂 " * 50}] * 200},
        f"{n_ids} prompt token ids": {"prompt_token_ids": list(range(n_ids))},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", type=int, default=1_000_000, help="token ids in the large body")
    ap.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    args = ap.parse_args()
    loop = asyncio.new_event_loop()
    for name, body in bodies(args.ids).items():
        raw = json.dumps(body).encode()
        request = _Request(raw)
        parse = best(lambda raw=raw: json.loads(raw), args.repeat)
        check = best(lambda r=request: loop.run_until_complete(
            check_request_json(r)), args.repeat)  # type: ignore[arg-type]
        print(f"{name:34s} {len(raw) / 1e6:6.2f} MB  parse {parse * 1e3:8.2f} ms  "
              f"check {check * 1e3:7.2f} ms  check/parse {check / parse:5.2f}")
    meta = {"task": "t", "answer": list(range(1000)), "nested": {"a": {"b": [1.5, None]}}}
    print(f"metadata check, 1000 ints: {best(lambda: check_metadata(meta)) * 1e3:.3f} ms")
    loop.close()


if __name__ == "__main__":
    main()
