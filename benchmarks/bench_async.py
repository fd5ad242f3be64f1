"""Asynchronous vs synchronous training on the demo task, side by side in one run.

    .venv/bin/python benchmarks/bench_async.py [--max-steps 60] [--async-staleness 4]

Both runs are the full `gspo up` stack (Redis, one hf rollout server, the learner with the
weight broadcast, the alphabet environment) with the same seed and hyper-parameters; only the
staleness bound differs:

- sync: ``--max-staleness 0``: every trained group was sampled by the weights being trained;
  the environment may only run one step's worth of groups ahead, and groups sampled by an
  older version are dropped;
- async: ``--max-staleness K``: sampling runs up to K versions ahead of the learner, so
  sampling and training overlap.

Prints trained tokens/s, time to reach the reward threshold, final reward and staleness, and
the async/sync ratios. Goal: async >= 1.5x the sync throughput at equal final reward.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gspo.runlog import read_metrics, summarize  # noqa: E402
from gspo.up import UpConfig, run_up  # noqa: E402


def run(name: str, staleness: int, args: argparse.Namespace, root: Path) -> dict[str, float]:
    cfg = UpConfig(run_dir=root / name, max_steps=args.max_steps, max_staleness=staleness,
                   groups_per_step=args.groups_per_step, lr=args.lr, minutes=args.minutes,
                   seed=args.seed, loss=args.loss)
    result = run_up(cfg)
    return summarize(read_metrics(result.metrics_path), threshold=args.threshold,
                     env_records=read_metrics(cfg.run_dir / "env_rewards.jsonl"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--groups-per-step", type=int, default=4)
    ap.add_argument("--async-staleness", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--loss", default="gspo")
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-async-"))
    rows = {"sync": run("sync", 0, args, root),
            "async": run("async", args.async_staleness, args, root)}
    keys = ["steps", "tokens_per_s", "sampled_time_to_threshold_s", "sampled_final_reward",
            "time_to_threshold_s", "final_reward", "staleness_mean", "dropped_stale"]
    print(f"{'mode':6} " + " ".join(f"{k:>20}" for k in keys))
    for mode, row in rows.items():
        print(f"{mode:6} " + " ".join(f"{row.get(k, float('nan')):20.3f}" for k in keys))
    s, a = rows["sync"], rows["async"]
    print(f"throughput ratio async/sync: {a['tokens_per_s'] / s['tokens_per_s']:.2f} "
          "(goal >= 1.5)")
    print(f"time to {args.threshold} (every sampled group) sync/async: "
          f"{s['sampled_time_to_threshold_s'] / a['sampled_time_to_threshold_s']:.2f}")
    print(f"final reward of sampled groups: sync {s['sampled_final_reward']:.3f}, "
          f"async {a['sampled_final_reward']:.3f}")
    print(json.dumps({"runs": rows, "dir": str(root)}))


if __name__ == "__main__":
    main()
