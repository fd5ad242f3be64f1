"""One knob at a time on the demo task: learning rate, group size, clip band, staleness.

    .venv/bin/python benchmarks/tune_sweep.py [--minutes 4] [--target 0.8] [--seed 0]
        [--variants baseline,lr=5e-4,lr=1e-2,group_size=4,group_size=16,clip=3,clip=0.3,
                    max_staleness=0,max_staleness=4,seed=1]

Each variant is the baseline (``gspo up``'s defaults: the tiny model, the alphabet task,
GSPO, lr 2e-3, G=8, 4 groups per step, max staleness 2, the GSPO clip band 3e-4/4e-4) with
one setting changed, trained through the whole ``gspo up`` stack from the same seed until the
last 32 sampled groups average ``--target`` or ``--minutes`` run out, one after the other in
this run. ``clip=K`` scales both clip half-widths by K. ``seed=1`` is the baseline with another
seed: how far two runs differ by chance alone; ``--seed`` sets every variant's seed (the model,
the tasks, the learner). Printed per variant: wall time and learner
steps until the target (by the reward of every sampled group), the reward of the last 32
groups, the mean clip fraction, the share of finished groups trained, and the time ratio to
the baseline measured in this run (docs/tuning.md reads them).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gspo_rl.launch.runlog import read_metrics, step_records, summarize  # noqa: E402
from gspo_rl.launch.up import UpConfig, run_up  # noqa: E402

DEFAULT_VARIANTS = ("baseline,lr=5e-4,lr=1e-2,group_size=4,group_size=16,clip=3,clip=0.3,"
                    "max_staleness=0,max_staleness=4,seed=1")
GSPO_CLIP = (3e-4, 4e-4)  # gspo_rl.learner.algorithm.config: GSPO's defaults


def variant_config(name: str, root: Path, minutes: float, target: float,
                   seed: int = 0) -> UpConfig:
    """The baseline with the one change ``name`` ("baseline", "lr=5e-4", "clip=3", ...)."""
    base: dict[str, Any] = {"run_dir": root / name.replace("=", "_"), "minutes": minutes,
                            "target_reward": target, "max_steps": 1000, "seed": seed}
    if name == "baseline":
        return UpConfig(**base)
    key, _, raw = name.partition("=")
    if key == "clip":
        low, high = (c * float(raw) for c in GSPO_CLIP)
        toml = root / f"clip_{raw}.toml"
        toml.write_text(f"[loss]\nclip_low = {low!r}\nclip_high = {high!r}\n")
        return UpConfig(**base, extra_learn_args=["--config", str(toml)])
    if key not in ("lr", "group_size", "max_staleness", "seed", "groups_per_step"):
        raise SystemExit(f"unknown variant {name!r}")
    return UpConfig(**{**base, key: float(raw) if key == "lr" else int(raw)})


def measure(cfg: UpConfig) -> dict[str, float]:
    result = run_up(cfg)
    records = step_records(read_metrics(result.metrics_path))
    env = read_metrics(cfg.run_dir / "env_rewards.jsonl")
    s = summarize(records, env_records=env)
    steps_at = float("nan")
    t = s.get("sampled_time_to_threshold_s", float("nan"))
    if not math.isnan(t) and env:
        at = env[0]["time"] + t
        steps_at = float(sum(1 for r in records if r["time"] <= at))
    trained = [float(r["trained_fraction"]) for r in records if "trained_fraction" in r]
    return {"time_s": t, "steps": steps_at, "final": s.get("sampled_final_reward", math.nan),
            "clip": s.get("clip_fraction_mean", math.nan),
            "trained": trained[-1] if trained else math.nan,
            "reached": float(bool(result.target_reached))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    names = [n for n in args.variants.split(",") if n]
    if "baseline" not in names:
        names.insert(0, "baseline")
    root = Path(tempfile.mkdtemp(prefix="tune-sweep-"))
    rows = {name: measure(variant_config(name, root, args.minutes, args.target, args.seed))
            for name in names}
    base = rows["baseline"]["time_s"]
    print(f"\n{'variant':16} {'to target (s)':>13} {'steps':>6} {'last 32':>8} "
          f"{'clip frac':>9} {'trained':>8} {'time ratio vs baseline':>23}")
    for name, r in rows.items():
        ratio = r["time_s"] / base if base and not math.isnan(base) else math.nan
        reached = f"{r['time_s']:13.0f}" if r["reached"] else f"{'not reached':>13}"
        print(f"{name:16} {reached} {r['steps']:6.0f} {r['final']:8.2f} {r['clip']:9.4f} "
              f"{r['trained']:8.0%} {ratio:23.2f}")
    print(f"(seed {args.seed}; target: the last 32 sampled groups average {args.target}; "
          f"limit {args.minutes:g} min per variant; runs in {root})")


if __name__ == "__main__":
    main()
