"""A ``gspo up`` run directory: each run trains from scratch, so a directory that holds an
earlier run is set aside first (``set_aside_previous_run``), and one holding anything else is
refused."""

from __future__ import annotations

import shutil
from pathlib import Path

# what a run writes in its run directory (start_stack, run_up, Processes' logs)
RUN_FILES = frozenset({"checkpoints", "redis", "model", "metrics.jsonl", "env_rewards.jsonl",
                       "evals.jsonl", "reward_curve.png", "redis.log", "server.log",
                       "learner.log", "tracking"})


class RunDirError(ValueError):
    """The run directory holds something that is not a gspo up run."""


def set_aside_previous_run(run_dir: Path) -> Path | None:
    """Every ``gspo up`` trains from scratch in its run directory. One that already holds a
    run (its checkpoints, which the learner will not train over, its Redis data, its
    metrics) is moved to ``<run_dir>.previous``, replacing the one kept there before; returns
    where it went (None: nothing to move). A directory with anything else in it is left
    alone and refused (``RunDirError``): it is not a run directory."""
    run_dir = run_dir.resolve()
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in RUN_FILES)
    if foreign:
        raise RunDirError(f"--run-dir {run_dir} holds files a gspo up run does not write "
                         f"({', '.join(foreign[:5])}): choose another run directory")
    previous = run_dir.with_name(run_dir.name + ".previous")
    if previous.exists():
        shutil.rmtree(previous)
    run_dir.rename(previous)
    return previous
