"""Train the demo from Python: start ``gspo up`` in the background, watch its records as they
are written, stop it when you like, read its result.

    python examples/python_api.py --run-dir runs/api --max-steps 30
    python examples/python_api.py --run-dir runs/api --stop-after 5 --report-to tensorboard

The same calls work in a notebook (the run is a child process: the notebook's event loop and
signals stay its own). Guide: docs/python-api.md. tests/gspo/test_api.py runs this script.
"""

from __future__ import annotations

import argparse

import gspo_rl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", default="runs/api")
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--stop-after", type=int, default=None,
                    help="Stop the run after this many learner steps.")
    ap.add_argument("--report-to", default="", help="tensorboard, wandb, mlflow")
    ap.add_argument("--target-reward", type=float, default=0.0,
                    help="Stop at this sampled reward (0: train --max-steps).")
    args = ap.parse_args()

    config = gspo_rl.UpConfig(run_dir=args.run_dir, max_steps=args.max_steps,
                              report_to=args.report_to, minutes=10,
                              target_reward=args.target_reward or None)
    with gspo_rl.start_up(config) as run:  # leaving the block stops a run still going
        print(f"started gspo up (pid {run.pid}); its output: {run.log_path}")
        for record in run.records():  # every record, as it is written, until the run ends
            if record.get("event") != "step":
                continue  # start, checkpoint, stall, stop, evaluation records
            print(f"step {record['step']}: reward {record['reward_mean']:.2f}, "
                  f"loss {record['loss']:.3g}, {record['tokens_per_s']:.0f} tok/s")
            if args.stop_after is not None and record["step"] >= args.stop_after:
                print("stopping")
                run.stop()  # graceful: the learner checkpoints, every process ends
                break  # its last steps (trained while it stopped) are in run.steps()
        result = run.wait()
    if result is None:  # stopped before it finished: its records are all there
        print(f"stopped after {len(run.steps())} steps; records in {run.metrics_path}")
    else:
        for line in result.summary(target_reward=config.target_reward or 0.0):
            print(line)


if __name__ == "__main__":
    main()
