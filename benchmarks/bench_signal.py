"""Spending generation where the learning signal is: task selection by difficulty and the
sampling budget, off against on, in the same run, on three workloads.

    .venv/bin/python benchmarks/bench_signal.py [--tasks math,rg,tool --seeds 0,1,2
        --max-steps 30 --minutes 8 --on-args='--no-signal-hold-s 5' --only on]

Each run is a whole ``gspo up`` (Redis, a server on the tiny model, the learner, the
environment) of ``--max-steps`` learner steps (or ``--minutes``), no target: "off" is
``--no-selection --no-signal-hold-s 0 --no-signal-drought-s 0`` (every task as drawn; a group
without signal leaves admission at once: how it was), "on" the defaults. Workloads:

- ``math``: the math tutorial (``clients/examples/math/tasks.toml``: tasks from data, a numeric
  verifier with a format reward, its eval set every 5 versions);
- ``rg``: reasoning-gym's ``leg_counting`` and ``basic_arithmetic`` (a tiny model earns
  nothing there: every group fails, the waste case);
- ``tool``: the calculator (multi-turn tool use) over a pool of 64 problems, selection on in
  "on".

Per run: groups generated and trained, sampled tokens generated and trained, the trained
shares, seconds, the last sampled reward, the last eval score (math) and the groups scored
per second in the second half of the run (the pace the budget settled at). Printed per
workload: the medians over seeds, and the ratios on/off of the trained token share and of the
time (goal on the tutorial: trained/generated tokens >= 4x off, and at least half the
generated groups trained; no slower, no lower eval).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {
    "math": ["--tasks", str(ROOT / "clients/examples/math/tasks.toml")],
    "rg": ["--tasks", "reasoning-gym:leg_counting,basic_arithmetic", "--env-arg",
           "sampling.max_tokens=16", "--env-arg", "size=200", "--env-arg", "eval_size=0"],
    "tool": ["--env", "calculator", "--env-arg", "pool=64", "--env-arg", "max_tokens=16"],
}
OFF = ["--no-selection", "--no-signal-hold-s", "0", "--no-signal-drought-s", "0"]


def run(task: str, setting: str, seed: int, args: argparse.Namespace, tmp: Path) -> dict:
    """One ``gspo up``; its figures from its records."""
    run_dir = tmp / f"{task}-{setting}-{seed}"
    extra = WORKLOADS[task] + (OFF if setting == "off" else args.on_args.split())
    if task == "tool" and setting == "on":
        extra = [*extra, "--env-arg", "selection=true"]
    cmd = [sys.executable, "-m", "gspo_rl.cli", "up", "--run-dir", str(run_dir), "--seed",
           str(seed), "--max-steps", str(args.max_steps), "--minutes", str(args.minutes),
           "--target-reward", "0", *extra]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "COLUMNS": "200"},
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=args.minutes * 60 + 900)
    except subprocess.TimeoutExpired:  # gspo up and every process it started
        os.killpg(proc.pid, signal.SIGKILL)
        limit = args.minutes * 60 + 900
        raise SystemExit(f"{task} {setting} seed {seed}: gspo up still running after "
                         f"{limit:.0f} s: killed (its run dir: {run_dir})") from None
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{task} {setting} seed {seed} failed:\n{err[-3000:]}")
    return figures(run_dir, seconds, out)


SUMMARY = re.compile(r"groups: (\d+) generated, (\d+) trained .*sampled tokens: (\d+) "
                     r"generated, (\d+) trained")


def figures(run_dir: Path, seconds: float, stdout: str) -> dict[str, float]:
    """From ``gspo up``'s summary (every group's fate, from Redis) and its records."""
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r.get("event", "step") == "step" and "step" in r]
    evals = [v for r in recs if r.get("event") == "eval" for k, v in r.items()
             if k.endswith("/mean_reward")]
    env_file = run_dir / "env_rewards.jsonl"
    env_recs = [json.loads(x) for x in
                (env_file.read_text().splitlines() if env_file.exists() else [])]
    env = [r["reward"] for r in env_recs[-32:]]
    found = SUMMARY.search(stdout)
    g_gen, g_tr, t_gen, t_tr = (int(x) for x in found.groups()) if found else (0, 0, 0, 0)
    return {"steps": len(steps), "seconds": seconds, "groups_generated": g_gen,
            "groups_trained": g_tr, "tokens_generated": t_gen, "tokens_trained": t_tr,
            "group_share": g_tr / g_gen if g_gen else 0.0,
            "token_share": t_tr / t_gen if t_gen else 0.0,
            "sampled_reward": sum(env) / max(1, len(env)),
            "late_groups_per_s": late_rate([float(r["time"]) for r in env_recs if "time" in r]),
            "eval": evals[-1] if evals else float("nan")}


def late_rate(times: list[float]) -> float:
    """Groups scored per second over the second half of the run's sampling (from its first
    group to its last): the pace it settled at, whatever the run's length."""
    if len(times) < 2:
        return float("nan")
    t0, t1 = min(times), max(times)
    mid = (t0 + t1) / 2
    return sum(t >= mid for t in times) / max(t1 - mid, 1e-9)


def report(task: str, results: dict[str, list[dict[str, Any]]]) -> None:
    def med(setting: str, key: str) -> float:
        return statistics.median(r[key] for r in results[setting])

    print(f"\n{task}: median over {len(results['on'])} seeds", flush=True)
    for key in ("steps", "seconds", "groups_generated", "groups_trained", "tokens_generated",
                "tokens_trained", "group_share", "token_share", "sampled_reward", "eval",
                "late_groups_per_s"):
        print(f"  {key:>16}: off {med('off', key):10.3f}   on {med('on', key):10.3f}")
    ratios = [a["token_share"] / b["token_share"] for a, b in
              zip(results["on"], results["off"], strict=True) if b["token_share"] > 0]
    time_ratios = [a["seconds"] / b["seconds"] for a, b in
                   zip(results["on"], results["off"], strict=True)]
    if ratios:
        print(f"  ratio on/off, trained token share: {statistics.median(ratios):.2f} "
              f"[{min(ratios):.2f}..{max(ratios):.2f}]")
    else:
        print("  ratio on/off, trained token share: n/a (nothing trained with it off)")
    print(f"  ratio on/off, seconds: {statistics.median(time_ratios):.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="math,rg,tool")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--on-args", default="", help="more gspo up flags for the 'on' setting, "
                   "e.g. --on-args='--no-signal-hold-s 5'")
    p.add_argument("--only", choices=("off", "on"), default=None,
                   help="run one setting (its runs are printed; no ratios)")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="gspo-signal-") as tmp:
        for task in args.tasks.split(","):
            results: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
            for seed in seeds:
                order = ("off", "on") if seed % 2 == 0 else ("on", "off")
                for setting in (s for s in order if args.only in (None, s)):
                    res = run(task, setting, seed, args, Path(tmp))
                    results[setting].append(res)
                    print(f"{task} {setting:>3} seed {seed}: {res['steps']} steps in "
                          f"{res['seconds']:.0f} s, {res['groups_generated']} groups "
                          f"generated, {res['groups_trained']} trained, tokens "
                          f"{res['token_share']:.1%} trained, eval {res['eval']:.3f}, "
                          f"{res['late_groups_per_s']:.2f} groups/s in its second half "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)
            if args.only is None:
                report(task, results)


if __name__ == "__main__":
    main()
