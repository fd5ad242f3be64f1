"""The update schedule (minibatches x epochs per step) against the losses: does GSPO's trust
region, active only when a step takes several optimizer steps, train better here?

    .venv/bin/python benchmarks/bench_schedule.py [--losses gspo,grpo] \
        [--schedules 1x1,4x1] [--seeds 0,1,2] [--workload demo] [--minutes 6] \
        [--max-steps 60] [--json out.json] [--plot curves.png] [--warm-start] [--lr LR]

Each cell is a whole ``gspo up`` run (asynchronous, the default staleness bound, the same
learning rate and seed for every schedule), one after the other in this process. A schedule
``MxE`` is ``--minibatches M --epochs E``; ``1x1`` (the default) is the baseline: with it the
update starts at pi_prox, every ratio is 1 and nothing is clipped. Workloads: ``demo`` (the
alphabet task), ``math`` (the math tutorial's task file), ``tool`` (the calculator, a
multi-turn tool-use environment; ``--warm-start`` starts every run from its supervised warm
start, docs/sft.md, made once), ``dialogue`` (``alphabet_dialogue``: the demo as a two-ask
conversation, a multi-turn task the tiny model learns), ``long`` (``long_letters``: 256-token
completions with partial credit, where sequence- and token-level ratios differ most; ``long_fixed``
the same with one half asked every time). Per loss
and schedule it prints, over the seeds: how many reached the target reward (sampled: every
group the environment scored), the median time to it and its ratio to the baseline's on the
same seeds, the final sampled reward, the last evaluation's mean reward (workloads with an eval
set), the clip fraction, ``is_weight_capped_fraction`` and the learner's seconds per step
(ratio to the baseline's). ``--plot``: every run's sampled reward by policy version, one colour
per loss and schedule, their mean over the seeds drawn thick. Results: BENCHMARKS.md ("Update
schedule").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gspo_rl.launch.runlog import (  # noqa: E402
    read_metrics,
    step_records,
    summarize,
    version_curve,
)
from gspo_rl.launch.up import UpConfig, run_up  # noqa: E402

WORKLOADS: dict[str, dict[str, Any]] = {
    "demo": {},
    "math": {"tasks": str(ROOT / "clients/examples/math/tasks.toml")},
    # multi-turn tool use: the calculator environment (clients/examples/calculator.py) over a
    # pool of 64 problems, two model turns per episode
    "tool": {"env": ["calculator"], "env_args": ["pool=64", "max_tokens=16"]},
    # multi-turn: the alphabet demo as a two-ask conversation (clients/examples/
    # alphabet_dialogue.py), which the tiny model learns from scratch
    "dialogue": {"env": ["alphabet_dialogue"]},
    # long completions (docs/reference/losses.md: the stability claim)
    "long": {"env": ["long_letters"], "env_args": ["length=256"]},
    # the same with one half for every prompt: the letters' mix to shift, no condition to carry
    "long_fixed": {"env": ["long_letters"], "env_args": ["length=256", "half=a to m"]},
}


def warm_start(root: Path) -> str:
    """The calculator's supervised warm start (docs/sft.md's recipe): demonstrations, a tiny
    model, ``gspo sft``; the checkpoint's directory. Made once, every run starts from it."""
    demos, tiny, sft = root / "demos.jsonl", root / "tiny", root / "sft"
    for cmd in (["-m", "gspo_rl.client.examples.calculator_demos", "--n", "128", "--out",
                 str(demos)],
                ["-m", "gspo_rl.cli", "tiny-model", str(tiny)],
                ["-m", "gspo_rl.cli", "sft", "--model", str(tiny), "--data", str(demos),
                 "--save-dir", str(sft), "--epochs", "4", "--batch-size", "8", "--lr", "3e-3",
                 "--warmup-steps", "4"]):
        subprocess.run([sys.executable, *cmd], check=True, stdout=subprocess.DEVNULL)
    checkpoint = sorted(sft.glob("step-*"))[-1]
    print(f"warm start: {checkpoint}", flush=True)
    return str(checkpoint)


def one_run(root: Path, loss: str, schedule: str, seed: int, args: argparse.Namespace
            ) -> dict[str, Any]:
    """One ``gspo up`` run; its figures, and its sampled reward by version (``curve``)."""
    m, e = (int(x) for x in schedule.split("x"))
    cfg = UpConfig(run_dir=root / f"{loss}-{schedule}-{seed}", loss=loss, seed=seed,
                   max_steps=args.max_steps, minutes=args.minutes, model=args.model,
                   lr=args.lr, target_reward=args.target,
                   **WORKLOADS[args.workload],
                   extra_learn_args=["--minibatches", str(m), "--epochs", str(e)])
    result = run_up(cfg)
    recs = [r for r in step_records(read_metrics(result.metrics_path)) if "reward_mean" in r]
    env = read_metrics(cfg.run_dir / "env_rewards.jsonl")
    s = summarize(recs, threshold=args.target, env_records=env)
    mean = lambda k: statistics.fmean([float(r.get(k, 0.0)) for r in recs]) if recs else 0.0  # noqa: E731
    return {"time_to_target_s": s.get("sampled_time_to_threshold_s", float("nan")),
            "final_reward": s.get("sampled_final_reward", float("nan")),
            "steps": float(len(recs)), "clip_fraction": mean("clip_fraction"),
            "is_weight_capped_fraction": mean("is_weight_capped_fraction"),
            "step_s": mean("compute_s"), "final_eval": _last_eval(cfg.run_dir),
            "curve": [[v, round(r, 4)] for v, r, _ in version_curve(env)]}


def _last_eval(run_dir: Path) -> float:
    """The mean reward of the run's last evaluation (its eval set: math); NaN without one."""
    evals = read_metrics(run_dir / "evals.jsonl") if (run_dir / "evals.jsonl").exists() else []
    return float(evals[-1]["metrics"]["mean_reward"]) if evals else float("nan")


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def plot(cells: dict[tuple[str, str], list[dict[str, Any]]], path: Path, title: str) -> None:
    """Sampled reward by version: each run thin, the mean over seeds thick, a colour per
    cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, ((loss, sched), runs) in enumerate(cells.items()):
        colour = f"C{i}"
        by_version: dict[int, list[float]] = {}
        for run in runs:
            xs, ys = zip(*run["curve"], strict=True) if run["curve"] else ((), ())
            ax.plot(xs, ys, color=colour, alpha=0.25, linewidth=0.8)
            for v, r in run["curve"]:
                by_version.setdefault(int(v), []).append(float(r))
        mean = sorted((v, statistics.fmean(r)) for v, r in by_version.items())
        if mean:
            ax.plot(*zip(*mean, strict=True), color=colour, linewidth=2.2,
                    label=f"{loss} {sched} (mean of {len(runs)} seeds)")
    ax.set_xlabel("policy version (learner step)")
    ax.set_ylabel("sampled reward (every group scored)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def report(cells: dict[tuple[str, str], list[dict[str, Any]]], baseline: str,
           target: float) -> None:
    print(f"{'loss':10} {'sched':5} {'reached':>7} {'t->tgt s':>8} {'x base':>6} "
          f"{'final':>6} {'eval':>6} {'clip':>7} {'capped':>7} {'step s':>6} {'x base':>6}")
    for (loss, sched), runs in cells.items():
        base = cells.get((loss, baseline), runs)
        reached = sum(r["time_to_target_s"] == r["time_to_target_s"] for r in runs)
        t, tb = (_median([r["time_to_target_s"] for r in x]) for x in (runs, base))
        st, stb = (statistics.fmean([r["step_s"] for r in x]) for x in (runs, base))
        print(f"{loss:10} {sched:5} {reached:>3}/{len(runs):<3} {t:8.0f} {t / tb:6.2f} "
              f"{_median([r['final_reward'] for r in runs]):6.3f} "
              f"{_median([r['final_eval'] for r in runs]):6.3f} "
              f"{statistics.fmean([r['clip_fraction'] for r in runs]):7.4f} "
              f"{statistics.fmean([r['is_weight_capped_fraction'] for r in runs]):7.4f} "
              f"{st:6.2f} {st / max(stb, 1e-9):6.2f}")
    print(f"(target: sampled reward {target} over the last groups; 'x base': against "
          f"{baseline} with the same loss and seeds; median over the seeds that reached it)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--losses", default="gspo,grpo")
    ap.add_argument("--schedules", default="1x1,4x1",
                    help="MxE: --minibatches M --epochs E; the first is the baseline")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="demo")
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--json", type=Path, default=None, help="also write every run's figures")
    ap.add_argument("--plot", type=Path, default=None, help="the reward curves, as a PNG")
    ap.add_argument("--model", default=None, help="a model directory (default: the tiny one)")
    ap.add_argument("--warm-start", action="store_true",
                    help="tool: start every run from the calculator's SFT warm start")
    ap.add_argument("--lr", type=float, default=None, help="default: gspo up's")
    args = ap.parse_args()
    schedules = [s for s in args.schedules.split(",") if s]
    root = Path(tempfile.mkdtemp(prefix="bench-schedule-"))
    if args.warm_start:
        args.model = warm_start(root)
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        for loss in args.losses.split(","):
            for sched in schedules:
                run = one_run(root, loss, sched, seed, args)
                cells.setdefault((loss, sched), []).append(run)
                figures = {k: v for k, v in run.items() if k != "curve"}
                print(f"[{loss} {sched} seed {seed}] {json.dumps(figures)}", flush=True)
    report(cells, schedules[0], args.target)
    if args.plot is not None:
        plot(cells, args.plot, f"{args.workload}: sampled reward, {len(cells)} cells")
    if args.json is not None:
        args.json.write_text(json.dumps(
            {f"{k[0]} {k[1]}": v for k, v in cells.items()}, indent=1))


if __name__ == "__main__":
    main()
