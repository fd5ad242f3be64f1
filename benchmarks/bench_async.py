"""Asynchronous vs synchronous training on the demo task, side by side in one run.

    .venv/bin/python benchmarks/bench_async.py [--max-steps 60] [--async-staleness 4]
        [--seeds 0,1,2] [--threshold 0.8]

Both runs are the full `gspo up` stack (Redis, one hf rollout server, the learner with the
weight broadcast, the alphabet environment) with the same seed and hyper-parameters; only the
staleness bound differs:

- sync: ``--max-staleness 0``: every trained group was sampled by the weights being trained;
  the environment may only run one step's worth of groups ahead, and groups sampled by an
  older version are dropped;
- async: ``--max-staleness K``: sampling runs up to K versions ahead of the learner, so
  sampling and training overlap.

Each run stops when the moving average of the last 32 sampled groups reaches ``--threshold``
(or at ``--max-steps`` / ``--minutes``). Why stop there: once the policy solves the task, most
groups have equal rewards and are dropped, the learner waits for the few that carry a signal,
and trained tokens/s measured past that point says how fast the task was solved, not how fast
the system trains. Per seed (the order of the two modes alternates between seeds), prints
trained tokens/s while learning, the wall time to the threshold and the final reward, then
the medians of the async/sync ratios over the seeds. Goal: async >= 1.5x the sync throughput
at equal final reward.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gspo_rl.launch.runlog import read_metrics, summarize  # noqa: E402
from gspo_rl.launch.up import UpConfig, run_up  # noqa: E402

KEYS = ["steps", "tokens_per_s", "sampled_time_to_threshold_s", "sampled_final_reward",
        "final_reward", "staleness_mean", "dropped_stale"]


def run(name: str, staleness: int, seed: int, args: argparse.Namespace,
        root: Path) -> dict[str, float]:
    cfg = UpConfig(run_dir=root / name, max_steps=args.max_steps, max_staleness=staleness,
                   groups_per_step=args.groups_per_step, lr=args.lr, minutes=args.minutes,
                   seed=seed, loss=args.loss, target_reward=args.threshold)
    result = run_up(cfg)
    out = summarize(read_metrics(result.metrics_path), threshold=args.threshold,
                    env_records=read_metrics(cfg.run_dir / "env_rewards.jsonl"))
    out["reached"] = float(bool(result.target_reached))
    return out


def ratio(num: float, den: float) -> float:
    return num / den if den and math.isfinite(num) and math.isfinite(den) else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--groups-per-step", type=int, default=4)
    ap.add_argument("--async-staleness", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--loss", default="gspo")
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one pair each")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-async-"))
    rows: dict[str, dict[str, dict[str, float]]] = {}
    print(f"{'seed':>4} {'mode':6} " + " ".join(f"{k:>27}" for k in KEYS), flush=True)
    for i, seed in enumerate(int(x) for x in args.seeds.split(",")):
        modes = [("sync", 0), ("async", args.async_staleness)]
        row: dict[str, dict[str, float]] = {}
        for mode, staleness in modes if i % 2 == 0 else modes[::-1]:
            row[mode] = run(f"{mode}-{seed}", staleness, seed, args, root)
        for mode in ("sync", "async"):
            print(f"{seed:>4} {mode:6} " + " ".join(
                f"{row[mode].get(k, float('nan')):27.3f}" for k in KEYS), flush=True)
        rows[str(seed)] = row
    tps = [ratio(r["async"].get("tokens_per_s", math.nan), r["sync"].get("tokens_per_s", math.nan))
           for r in rows.values()]
    ttt = [ratio(r["sync"].get("sampled_time_to_threshold_s", math.nan),
                 r["async"].get("sampled_time_to_threshold_s", math.nan)) for r in rows.values()]
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    print(f"throughput ratio async/sync: median {med(tps):.2f} over {len(tps)} seeds "
          f"({', '.join(f'{x:.2f}' for x in tps)}) (goal >= 1.5)")
    print(f"time to {args.threshold} (every sampled group) sync/async: median {med(ttt):.2f} "
          f"({', '.join(f'{x:.2f}' for x in ttt)}; nan: a run did not reach it)")
    for mode in ("sync", "async"):
        finals = [r[mode].get("sampled_final_reward", math.nan) for r in rows.values()]
        reached = sum(int(r[mode]["reached"]) for r in rows.values())
        print(f"{mode}: reached {args.threshold} in {reached}/{len(rows)} runs; final sampled "
              f"reward {', '.join(f'{x:.3f}' for x in finals)}")
    print(json.dumps({"runs": rows, "dir": str(root)}))


if __name__ == "__main__":
    main()
