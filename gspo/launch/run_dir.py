"""A ``gspo up`` run directory: a run trains from scratch, so a directory that holds an
earlier run is set aside first (``set_aside_previous_run``), and one holding anything else is
refused; or it continues the run there (``gspo up --resume``: ``previous_settings``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

SETTINGS_FILE = "up_config.json"
# what a run writes in its run directory (start_stack, run_up, Processes' logs)
RUN_FILES = frozenset({"checkpoints", "redis", "model", "metrics.jsonl", "env_rewards.jsonl",
                       "evals.jsonl", "reward_curve.png", "redis.log", "server.log",
                       "learner.log", "tracking", SETTINGS_FILE})


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


def previous_settings(run_dir: Path) -> dict[str, Any]:
    """The settings of the run in ``run_dir`` (its ``up_config.json``), to continue it
    (``gspo up --resume``); ``RunDirError`` when there is no run there to continue. A Redis
    URL whose password the file hides is left out: give it again."""
    path = Path(run_dir) / SETTINGS_FILE
    if not path.is_file():
        raise RunDirError(f"--resume: {run_dir} holds no gspo up run to continue (no "
                          f"{SETTINGS_FILE}); start one without --resume")
    settings = json.loads(path.read_text())
    if "***" in str(settings.get("redis_url") or ""):
        settings.pop("redis_url")
    settings.pop("resume", None)
    return settings


def groups_played(run_dir: Path) -> int:
    """How many groups the environment of the run in ``run_dir`` finished so far (a resumed
    environment starts its task draws past them)."""
    path = Path(run_dir) / "env_rewards.jsonl"
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(1 for _ in f)
