"""Admission control on vs off: how many generated groups are trained, and whether holding
groups back slows learning. Both in one run, on the full `gspo up` stack.

    .venv/bin/python benchmarks/bench_admission.py [--minutes 2] [--configs demo,compose]
        [--seed 0]

Configs (the environment's concurrency differs; 4 groups per step, group size 8,
``max_staleness`` 2, lr 2e-3 in both):

- demo: ``gspo up``'s defaults (concurrency 4);
- compose: docker-compose.yml's cpu profile (``GSPO_ENV_CONCURRENCY`` 8,
  docker/learner-cpu.toml).

Each config runs twice for the same wall time (``--minutes``, no reward target, no step cap),
admission on and off (``gspo up --no-admission``: the server admits everything, as before
issue 15), in alternating order. Printed per run: the fate of every generated group
(trained, dropped stale, dropped for equal rewards, in flight at the end), the trained
fraction (of finished groups; and of those with a learning signal, i.e. leaving out
equal-reward groups, which no admission rule can make trainable), learner steps per minute,
the time until every sampled group's reward (moving window of 32) first reached 0.8, and the
reward at the end (the learner's over its last 5 steps; every sampled group's over the last
32), all at the same wall time. Once the task is solved most groups have equal rewards (all
correct) and are dropped, and the learner waits for the few with a signal: steps/min and the
overall trained fraction past that point say how solved the task is, not how fast the system
trains (as in bench_async.py); the time to 0.8 and the fraction among groups with a signal
are the figures that compare admission on and off. Then the ratios on/off. Goal: trained fraction
>= 0.9 with admission, steps/min and reward not lower than without.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gspo_rl.launch.runlog import read_metrics, step_records, summarize  # noqa: E402
from gspo_rl.launch.up import UpConfig, run_up  # noqa: E402

CONFIGS = {"demo": 4, "compose": 8}  # environment concurrency


def run(name: str, concurrency: int, admission: bool, args: argparse.Namespace,
        root: Path) -> dict[str, float]:
    cfg = UpConfig(run_dir=root / name, max_steps=100_000, minutes=args.minutes,
                   concurrency=concurrency, admission=admission, seed=args.seed,
                   target_reward=None)
    result = run_up(cfg)
    records = read_metrics(result.metrics_path)
    steps = [r for r in step_records(records) if "reward_mean" in r]
    out = summarize(records, env_records=read_metrics(cfg.run_dir / "env_rewards.jsonl"))
    out["steps_per_min"] = len(steps) / args.minutes  # the environment's wall time
    g = result.groups or {}
    finished = g.get("generated", 0) - g.get("in_flight", 0)
    equal = g.get("dropped_zero_variance", 0)
    out.update({k: float(v) for k, v in g.items()})
    out["trained_fraction"] = g.get("trained", 0) / finished if finished else math.nan
    out["trained_fraction_with_signal"] = (g.get("trained", 0) / (finished - equal)
                                           if finished > equal else math.nan)
    return out


COLUMNS = ["generated", "trained", "dropped_stale", "dropped_zero_variance", "in_flight",
           "trained_fraction", "trained_fraction_with_signal", "steps_per_min",
           "sampled_time_to_threshold_s", "final_reward", "sampled_final_reward"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--configs", default="demo,compose")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-admission-"))
    rows: dict[str, dict[str, dict[str, float]]] = {}
    print(f"{'config':8} {'admission':9} " + " ".join(f"{c:>28}" for c in COLUMNS), flush=True)
    for i, name in enumerate(args.configs.split(",")):
        modes = [True, False] if i % 2 == 0 else [False, True]
        row = {("on" if a else "off"): run(f"{name}-{'on' if a else 'off'}", CONFIGS[name], a,
                                           args, root) for a in modes}
        for mode in ("on", "off"):
            print(f"{name:8} {mode:9} " + " ".join(
                f"{row[mode].get(c, math.nan):28.3f}" for c in COLUMNS), flush=True)
        on, off = row["on"], row["off"]
        ratio = {k: on.get(k, math.nan) / off[k] if off.get(k) else math.nan
                 for k in ("steps_per_min", "sampled_final_reward", "final_reward")}
        ttt = "sampled_time_to_threshold_s"
        ratio[ttt] = off.get(ttt, math.nan) / on[ttt] if on.get(ttt) else math.nan
        print(f"{name}: trained fraction on {on['trained_fraction']:.3f} vs off "
              f"{off['trained_fraction']:.3f} (with a signal: "
              f"{on['trained_fraction_with_signal']:.3f} vs "
              f"{off['trained_fraction_with_signal']:.3f}); ratio on/off: steps/min "
              f"{ratio['steps_per_min']:.2f}, sampled reward "
              f"{ratio['sampled_final_reward']:.2f}, learner reward {ratio['final_reward']:.2f}; "
              f"speed-up to a sampled reward of 0.8 (time off/on) {ratio[ttt]:.2f}",
              flush=True)
        rows[name] = row
    print(json.dumps({"runs": rows, "dir": str(root)}))


if __name__ == "__main__":
    main()
