"""How many GPUs of a Qwen3-8B fleet one Redis (and one learner-side reader) can feed.

`.venv/bin/python benchmarks/sim_fleet.py` (defaults: ~6-10 minutes on 2 shared cores)

Simulated rollout servers drive the real protocol against a real redis-server (the shipped
``docker/redis.conf``: AOF, everysec): each is an asyncio task with its own ``RolloutStore``
(admission read, ``record_group``, ``post_rewards`` of the group's rewards, sweeper, pending
count), its engine replaced by a token emitter (``benchmarks/lib/fleet_emit.py``: lengths
lognormal around the mean, clipped to the 40,960-token context; 256-token prompts; random ids
and float32 logprobs), in ``--workers`` processes; ``--drop-fraction`` of the groups get equal
rewards (dropped). One reader process runs ``GroupReader.read_batch`` + ``ack``. Reported:
not wall throughput (2 shared cores) but CPU per sample of Redis's main thread (INFO cpu),
the reader and the store clients; Redis memory per sample in each state (INFO memory); one
admission read's cost against the server count (whether it grows with the fleet). Ceilings:
samples/s at one saturated Redis core, at one reader, at ``--memory-gib`` (the staleness
bound's groups + retention: trained records ``keep_trained_s``, dropped ones
``dropped_records_ttl_s``, tombstones ``finished_ttl_s``, as measured). Baseline in the same
run: raw redis-py XADD of the published groups' ``pack_ready_group`` bytes, XREADGROUP + XACK.

GPUs fed = ceiling x completion tokens per sample / ``--gpu-tokens-per-s``, an ASSUMED rate of
Qwen3-8B bf16 under vLLM on one H100: 2,500 (long generations: the KV cache caps the batch near
50 sequences of 16k tokens) and 10,000 tokens/s (short ones at batch 256+; published vLLM
figures for 8B models on one H100 run from several thousand to ~15k output tokens/s).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.lib.fleet_emit import BYTES_PER_TOKEN, Shape  # noqa: E402
from benchmarks.lib.fleet_model import GIB, Assumptions  # noqa: E402
from benchmarks.lib.fleet_report import print_report  # noqa: E402
from benchmarks.lib.fleet_run import RunParams, best, run_point  # noqa: E402


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=_ints, default=[1024, 4096, 16384, 32768],
                    help="mean tokens per sample (prompt + completion), a list")
    ap.add_argument("--group-sizes", type=_ints, default=[8, 16])
    ap.add_argument("--shape-servers", type=int, default=64,
                    help="simulated servers for the shape sweep")
    ap.add_argument("--servers", type=_ints, default=[8, 64, 256],
                    help="simulated servers (asyncio tasks) of the load sweep, a list")
    ap.add_argument("--rates", type=_floats, default=[0, 300],
                    help="target samples/s of the load sweep (0: as fast as it can)")
    ap.add_argument("--load-shape", default="4096x8", help="TOKENSxGROUP of the load sweep")
    ap.add_argument("--workers", type=int, default=3, help="server processes")
    ap.add_argument("--drop-fraction", type=float, default=0.25,
                    help="groups with equal rewards (dropped)")
    ap.add_argument("--run-mib", type=float, default=128, help="sample bytes per run")
    ap.add_argument("--min-samples", type=int, default=256)
    ap.add_argument("--max-samples", type=int, default=4000)
    ap.add_argument("--mem-mib", type=float, default=48, help="sample bytes per memory state")
    ap.add_argument("--reader-batch-samples", type=int, default=256,
                    help="samples per read_batch (groups: this // group size)")
    ap.add_argument("--reader-step-s", type=float, default=0.0,
                    help="pause after each batch (0: read as fast as it can)")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--sigma", type=float, default=0.5, help="lognormal sigma of lengths")
    ap.add_argument("--max-tokens", type=int, default=40_960, help="context (length clip)")
    ap.add_argument("--no-admission", action="store_true",
                    help="servers skip the admission read and pending count")
    ap.add_argument("--admission-servers", type=_ints, default=[8, 64, 256, 1024, 4096],
                    help="server counts at which one admission read is measured")
    ap.add_argument("--gpus-per-server", type=float, default=1.0,
                    help="GPUs behind one rollout server (Qwen3-8B: 1, data parallel)")
    ap.add_argument("--max-staleness", type=int, default=2)
    ap.add_argument("--groups-per-step", type=int, default=512)
    ap.add_argument("--memory-gib", type=float, default=64.0)
    ap.add_argument("--gpu-tokens-per-s", type=_floats, default=[2500, 10000],
                    help="ASSUMED generated tokens/s of one H100 (Qwen3-8B bf16, vLLM)")
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of each point; the least CPU per sample is kept")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def _shape(args: argparse.Namespace, tokens: int, group: int) -> Shape:
    return Shape(tokens, group, args.prompt, args.sigma, args.max_tokens)


def _mem_groups(args: argparse.Namespace, shape: Shape) -> int:
    return max(2, int(args.mem_mib * 2 ** 20 / (shape.tokens * BYTES_PER_TOKEN * shape.group)))


def sweep(args: argparse.Namespace, params: RunParams, url: str) -> dict:
    """Every measurement: per shape (memory, ours, raw), then the load sweep."""
    from benchmarks.lib.fleet_redis import measure_memory

    out: dict = {"shapes": [], "load": []}
    for i, (t, g) in enumerate((t, g) for t in args.tokens for g in args.group_sizes):
        shape = _shape(args, t, g)
        mem = measure_memory(url, shape, _mem_groups(args, shape), seed=args.seed)
        runs: dict[str, list] = {"ours": [], "raw": []}
        for r in range(args.repeats):  # the order alternating: AOF growth, rewrites
            for mode in (("ours", "raw") if (i + r) % 2 == 0 else ("raw", "ours")):
                runs[mode].append(run_point(url, params, shape, args.shape_servers, 0.0, mode))
        out["shapes"].append({"shape": shape, "mem": mem,
                              **{m: best(points) for m, points in runs.items()}})
        print(f"  {shape.name}: done", flush=True)
    lt, lg = (int(x) for x in args.load_shape.lower().split("x"))
    load_shape = _shape(args, lt, lg)
    done = {s["shape"]: s["ours"] for s in out["shapes"]}
    for servers in args.servers:
        for rate in args.rates:
            if rate == 0 and servers == args.shape_servers and load_shape in done:
                point = done[load_shape]  # measured in the shape sweep
            else:
                point = best([run_point(url, params, load_shape, servers, rate, "ours")
                              for _ in range(args.repeats)])
            out["load"].append({"servers": servers, "rate": rate, "ours": point})
            print(f"  load {servers} servers, {rate:g}/s: done", flush=True)
    out["load_shape"] = load_shape
    if not args.no_admission:
        from benchmarks.lib.fleet_admission import measure_admission

        out["admission"] = measure_admission(url, args.admission_servers)
    return out


def main() -> None:
    args = parse_args()
    import timeit

    from benchmarks.bench_queue import start_redis, stop
    from gspo_rl.redisq.groups.types import QueueConfig
    from gspo_rl.redisq.ready.reader import KEEP_TRAINED_S

    calib = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6
    print(f"cpus: {os.cpu_count()}, load average before: {os.getloadavg()}, "
          f"sum(range(1000)): {calib:.1f} us (about 8-10 us on an idle modern core)", flush=True)
    qc = QueueConfig()
    assume = Assumptions(args.drop_fraction, args.max_staleness, args.groups_per_step,
                         args.memory_gib * GIB, KEEP_TRAINED_S, qc.finished_ttl_s,
                         getattr(qc, "dropped_records_ttl_s", qc.finished_ttl_s))
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_redis(Path(tmp))
        try:
            params = RunParams(url=url, workers=args.workers, drop_fraction=args.drop_fraction,
                               run_bytes=args.run_mib * 2 ** 20, min_samples=args.min_samples,
                               max_samples=args.max_samples,
                               reader_batch_samples=args.reader_batch_samples,
                               reader_step_s=args.reader_step_s,
                               admission=not args.no_admission, seed=args.seed)
            results = sweep(args, params, url)
        finally:
            stop(proc)
    print(f"load average after: {os.getloadavg()}")
    print_report(args, assume, results)


if __name__ == "__main__":
    main()
