"""Asynchronous vs synchronous training, each side on its own cores, side by side per seed.

    .venv/bin/python benchmarks/bench_async.py [--task demo|letters|dialogue]
        [--seeds 0,1,2,3,4] [--async-staleness 2] [--pin on|off] [--threshold T]
        [--max-steps N] [--minutes M] [--env-arg turn_credit=true] [--learn-arg '...']
    .venv/bin/python benchmarks/bench_async.py --sweep [--staleness 2,4,8]
        [--losses gspo,grpo,sapo] [--task letters] [--seeds 0,1,2]
    python benchmarks/bench_async.py --device cuda ...   # server and learner on one GPU

Each run is the whole `gspo up` stack; the modes differ only in the staleness bound: sync
``--max-staleness 0``, async ``--max-staleness K`` (the learner's default ``--old-logprobs
auto``: behaviour log-probs in sync, the decoupled objective in async). ``--pin on``: the server
and Redis get one half of the usable cores, the learner the other, in both modes (as two
devices would; ``UpConfig.cpus``); the environment (this process) is not pinned. The
environment keeps ``(K + 1) x groups_per_step`` groups going in both modes, so that the bound
binds. The modes alternate which runs first. Tasks: "demo" (alphabet, target 0.8), "letters"
(``benchmarks/tasks/letters.toml``, 0.7, a longer curve), "dialogue" (``alphabet_dialogue``,
multi-turn, 0.8). A run stops at the target (moving mean of the last 32 sampled groups),
``--max-steps`` or ``--minutes``.

Per run: time from the first sampled group to the target, final sampled reward, trained
fraction of the finished groups, mean staleness, clip fraction, fraction of importance weights
at the cap, trained tokens/s. Printed: median and spread of sync time / async time (seeds where
both reached the target) and of the throughput ratio. ``--sweep``: async only, each loss at each
bound (time to target, clip fraction). ``--out FILE``: every run as JSON. Why each choice:
BENCHMARKS.md, "Asynchronous vs synchronous, each side on its own cores".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gspo_rl.launch.runlog import read_metrics, step_records, summarize  # noqa: E402
from gspo_rl.launch.up import UpConfig, run_up  # noqa: E402

TASKS: dict[str, dict[str, Any]] = {
    "demo": {"tasks": None, "threshold": 0.8, "max_steps": 120, "minutes": 6.0},
    "letters": {"tasks": str(Path(__file__).resolve().parent / "tasks" / "letters.toml"),
                "threshold": 0.7, "max_steps": 400, "minutes": 15.0},
    # multi-turn: two asks per episode (clients/examples/alphabet_dialogue.py)
    "dialogue": {"tasks": None, "env": ["alphabet_dialogue"], "threshold": 0.8,
                 "max_steps": 200, "minutes": 8.0},
}
COLUMNS = [("time_to_target_s", "time to target s", 16), ("final_reward", "final reward", 12),
           ("trained_fraction", "trained frac", 12), ("staleness_mean", "staleness", 9),
           ("clip_fraction_mean", "clip frac", 9), ("is_capped_mean", "w capped", 8),
           ("trained_tokens_per_s", "trained tok/s", 13), ("steps", "steps", 5),
           ("wall_s", "wall s", 7)]


def core_split(pin: bool) -> dict[str, list[int]]:
    """Server and Redis on the first half of the usable cores, the learner on the rest."""
    cores = sorted(os.sched_getaffinity(0))
    if not pin or len(cores) < 2:
        if pin:
            print(f"only {len(cores)} usable core(s): not pinned", flush=True)
        return {}
    half = len(cores) // 2
    return {"server": cores[:half], "redis": cores[:half], "learner": cores[half:]}


def figures(run_dir: Path, metrics: Path, threshold: float, groups: dict[str, int] | None
            ) -> dict[str, float]:
    """One run's figures from its records (``gspo_rl.launch.runlog``) and group fates."""
    records = read_metrics(metrics)
    env = read_metrics(run_dir / "env_rewards.jsonl")
    base = summarize(records, threshold=threshold, env_records=env)
    steps = [r for r in step_records(records) if "time" in r]
    out = {"steps": base.get("steps", 0.0),
           "time_to_target_s": base.get("sampled_time_to_threshold_s", math.nan),
           "final_reward": base.get("sampled_final_reward", math.nan),
           "staleness_mean": base.get("staleness_mean", math.nan),
           "clip_fraction_mean": base.get("clip_fraction_mean", math.nan)}
    capped = [float(r["is_weight_capped_fraction"]) for r in steps
              if "is_weight_capped_fraction" in r]
    out["is_capped_mean"] = sum(capped) / len(capped) if capped else 0.0
    span = steps[-1]["time"] - steps[0]["time"] if len(steps) > 1 else 0.0
    trained = sum(float(r.get("trained_tokens", 0.0)) for r in steps[1:])
    out["trained_tokens_per_s"] = trained / span if span > 0 else math.nan
    if groups:
        finished = groups.get("generated", 0) - groups.get("in_flight", 0)
        out["trained_fraction"] = groups.get("trained", 0) / max(1, finished)
    return out


def run(name: str, staleness: int, loss: str, seed: int, args: argparse.Namespace,
        root: Path, bound: int | None = None) -> dict[str, float]:
    """One ``gspo up`` run; ``bound``: the staleness bound that sizes the environment's
    concurrency (default: this run's)."""
    task = TASKS[args.task]
    extra = [] if args.old_logprobs == "auto" else ["--old-logprobs", args.old_logprobs]
    extra += args.learn_arg.split()
    if args.device and args.device.startswith("cuda"):  # the server's dtype (as on the CPU)
        extra += ["--param-dtype", "float32"]
    concurrency = args.concurrency or (
        (staleness if bound is None else bound) + 1) * args.groups_per_step
    cfg = UpConfig(run_dir=root / name, max_steps=args.max_steps, max_staleness=staleness,
                   groups_per_step=args.groups_per_step, lr=args.lr, minutes=args.minutes,
                   seed=seed, loss=loss, target_reward=args.threshold, tasks=task["tasks"],
                   concurrency=concurrency, cpus=args.cpus, extra_learn_args=extra,
                   device=args.device, env_args=args.env_arg,
                   **({"env": task["env"]} if task.get("env") else {}))
    t0 = time.monotonic()
    result = run_up(cfg)
    out = figures(cfg.run_dir, result.metrics_path, args.threshold, result.groups)
    out["wall_s"] = time.monotonic() - t0
    out["reached"] = float(bool(result.target_reached))
    out["load"] = os.getloadavg()[0]
    return out


def ratio(num: float, den: float) -> float:
    return num / den if den and math.isfinite(num) and math.isfinite(den) else math.nan


def spread(xs: list[float]) -> str:
    """"median m (min..max, n)" over the finite values."""
    ok = sorted(x for x in xs if math.isfinite(x))
    if not ok:
        return f"n/a (0 of {len(xs)})"
    return (f"median {statistics.median(ok):.2f} ({ok[0]:.2f}..{ok[-1]:.2f}, {len(ok)} of "
            f"{len(xs)}; each: {', '.join(f'{x:.2f}' for x in xs)})")


def line(label: str, fig: dict[str, float]) -> str:
    return f"{label:24} " + " ".join(f"{fig.get(k, math.nan):>{w}.3f}" for k, _, w in COLUMNS)


def header() -> str:
    return f"{'run':24} " + " ".join(f"{title:>{w}}" for _, title, w in COLUMNS)


def compare(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Sync vs async per seed, alternating which runs first."""
    rows: dict[str, dict[str, dict[str, float]]] = {}
    print(header(), flush=True)
    for i, seed in enumerate(args.seed_list):
        modes = [("sync", 0), ("async", args.async_staleness)]
        row: dict[str, dict[str, float]] = {}
        for mode, staleness in modes if i % 2 == 0 else modes[::-1]:
            row[mode] = run(f"{mode}-{seed}", staleness, args.loss, seed, args, root,
                            bound=args.async_staleness)
            print(line(f"seed {seed} {mode} (S={staleness})", row[mode]), flush=True)
        rows[str(seed)] = row
    ttt = [ratio(r["sync"]["time_to_target_s"], r["async"]["time_to_target_s"])
           for r in rows.values()]
    tps = [ratio(r["async"]["trained_tokens_per_s"], r["sync"]["trained_tokens_per_s"])
           for r in rows.values()]
    print(f"time to {args.threshold}, sync / async: {spread(ttt)} (goal: median >= 1.5; "
          "nan: a run did not reach it)")
    print(f"trained tokens/s, async / sync: {spread(tps)}")
    for mode in ("sync", "async"):
        reached = sum(int(r[mode]["reached"]) for r in rows.values())
        finals = [r[mode]["final_reward"] for r in rows.values()]
        print(f"{mode}: reached {args.threshold} in {reached}/{len(rows)} runs; final sampled "
              f"reward median {statistics.median(finals):.3f}")
    return rows


def sweep(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Async only: each loss at each staleness bound, every seed."""
    rows: dict[str, dict[str, float]] = {}
    print(header(), flush=True)
    for seed in args.seed_list:
        for loss in args.losses.split(","):
            for s in (int(x) for x in args.staleness.split(",")):
                name = f"{loss}-S{s}-{seed}"
                rows[name] = run(name, s, loss, seed, args, root)
                print(line(name, rows[name]), flush=True)
    print("median over seeds: time to target s | clip fraction | w capped | reached")
    for loss in args.losses.split(","):
        for s in args.staleness.split(","):
            runs = [rows[f"{loss}-S{s}-{seed}"] for seed in args.seed_list]
            med = {k: statistics.median([r[k] for r in runs]) for k in
                   ("time_to_target_s", "clip_fraction_mean", "is_capped_mean")}
            print(f"{loss:10} S={s:>2}: {med['time_to_target_s']:8.1f} | "
                  f"{med['clip_fraction_mean']:.3f} | {med['is_capped_mean']:.3f} | "
                  f"{sum(int(r['reached']) for r in runs)}/{len(runs)}")
    return rows


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="demo")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds")
    ap.add_argument("--async-staleness", type=int, default=2)
    ap.add_argument("--loss", default="gspo")
    ap.add_argument("--old-logprobs", choices=["auto", "behavior", "recompute"],
                    default="auto", help="the learner's --old-logprobs (both modes)")
    ap.add_argument("--pin", choices=["on", "off"], default="on")
    ap.add_argument("--env-arg", action="append", default=[],
                    help="the environment's argument, key=value (repeatable; gspo up's)")
    ap.add_argument("--learn-arg", default="",
                    help="more learner flags, both modes (e.g. '--minibatches 4')")
    ap.add_argument("--threshold", type=float, help="target reward (default: the task's)")
    ap.add_argument("--max-steps", type=int, help="default: the task's")
    ap.add_argument("--minutes", type=float, help="per run (default: the task's)")
    ap.add_argument("--groups-per-step", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=0,
                    help="groups the environment samples at once; 0 (default): as many as "
                         "the (async) staleness bound admits, (S + 1) x groups per step, so "
                         "that the bound binds (the same in both modes)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--sweep", action="store_true", help="async only, staleness x losses")
    ap.add_argument("--staleness", default="2,4,8", help="--sweep's bounds")
    ap.add_argument("--losses", default="gspo,grpo,sapo", help="--sweep's losses")
    ap.add_argument("--out", type=Path, help="write every run's figures here (JSON)")
    ap.add_argument("--device", help="server and learner device (cuda: both on one GPU, "
                    "weights over CUDA IPC); default: theirs (the CPU here)")
    args = ap.parse_args()
    task = TASKS[args.task]
    for key in ("threshold", "max_steps", "minutes"):
        if getattr(args, key) is None:
            setattr(args, key, task[key])
    args.seed_list = [int(x) for x in args.seeds.split(",")]
    args.cpus = core_split(args.pin == "on")
    return args


def main() -> None:
    args = parse()
    root = Path(tempfile.mkdtemp(prefix="bench-async-"))
    print(f"task {args.task}, target {args.threshold}, pinning {args.cpus or 'off'}, "
          f"load average {os.getloadavg()[0]:.1f}, runs in {root}", flush=True)
    rows = sweep(args, root) if args.sweep else compare(args, root)
    if args.out is not None:
        args.out.write_text(json.dumps({"args": {k: v for k, v in vars(args).items()
                                                 if k != "out"}, "runs": rows}, indent=1,
                                       default=str))


if __name__ == "__main__":
    main()
