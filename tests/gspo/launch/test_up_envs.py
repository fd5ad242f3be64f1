"""`gspo up` as users run it, end to end (each a real `gspo up`: Redis, server, learner,
environment): the quick start run twice in one run directory (`--resume` after a
Ctrl-C: tests/gspo/launch/test_up.py); and three verifiers environments (the real package,
tasksets defined in the tests) and a TextArena game (``textarena:``, the real package) trained
side by side for a few steps, each reported apart."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from gspo_rl.launch.runlog import read_metrics, step_records

REPO = Path(__file__).resolve().parents[3]
VF = REPO / "tests" / "clients" / "adapters" / "verifiers_envs"


def _run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "80"})


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_quick_start_runs_twice(tmp_path: Path) -> None:
    run_dir = tmp_path / "up"
    quick = ["bash", "scripts/up.sh", "--run-dir", str(run_dir), "--max-steps", "2",
             "--target-reward", "0", "--minutes", "4"]
    first = _run(quick)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    second = _run(quick)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"the earlier run in {run_dir} was moved to {run_dir}.previous" in second.stdout
    assert (tmp_path / "up.previous" / "up_config.json").is_file()
    assert [r["step"] for r in step_records(read_metrics(run_dir / "metrics.jsonl"))] == [1, 2]
    # a second set-up installs nothing and says so in one line (no pip or setuptools output)
    assert "[setup] up to date" in second.stdout
    assert "setuptools" not in (second.stdout + second.stderr).lower()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_verifiers_environments_and_a_textarena_game_train_side_by_side(
        tmp_path: Path) -> None:
    names = ["gspo_vf_math", "gspo_vf_guess", "gspo_vf_tools"]
    game = "GuessTheNumber-v0"
    args = [".venv/bin/gspo", "up", "--run-dir", str(tmp_path / "run"), "--max-steps", "2",
            "--groups-per-step", "2", "--group-size", "2", "--target-reward", "0",
            "--read-timeout-s", "120", "--minutes", "6"]
    for n in names:
        args += ["--env", f"verifiers:{VF / n}", "--env-arg", f"{n}:harness=null",
                 "--env-arg", f"{n}:sampling.max_tokens=8"]
    args += ["--env-arg", "gspo_vf_guess:taskset.turns=2"]
    # the math taskset's first two tasks held out: evaluated at the start and after training
    args += ["--env-arg", "gspo_vf_math:eval.limit=2", "--env-arg", "gspo_vf_math:eval.samples=1"]
    # one-token replies of the tiny model are often numbers: valid guesses, rewards that vary
    args += ["--env", f"textarena:{game}", "--env-arg", f"{game}:sampling.max_tokens=1",
             "--env-arg", f"{game}:game.max_number=999", "--env-arg", f"{game}:max_turns=4"]
    r = _run(args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    records = step_records(read_metrics(tmp_path / "run" / "metrics.jsonl"))
    assert [s["step"] for s in records] == [1, 2]
    assert all(s["groups"] == 2 for s in records), "a full batch every step"
    # which environments fill the two batches is a race (the game plays fastest, and a
    # verifiers group with equal rewards is dropped): each step names those it trained
    trained = {n for s in records for n in [*names, game] if f"env/{n}/groups" in s}
    assert trained, "no step reported its environments"
    assert all(sum(s.get(f"env/{n}/groups", 0) for n in [*names, game]) == s["groups"]
               for s in records), records
    lines = read_metrics(tmp_path / "run" / "env_rewards.jsonl")
    played = {line["env"] for line in lines}
    assert played == {*names, game}, f"every environment played groups: {played}"
    # a verifiers task is logged as its data, not as <... object at 0x...>
    assert all(isinstance(line["task"], dict) and line["task"]["prompt"]
               for line in lines if line["env"] in names), lines
    evals = read_metrics(tmp_path / "run" / "evals.jsonl")
    versions = [e["policy_version"] for e in evals if e["name"] == "gspo_vf_math"]
    assert versions and versions[0] < 2 and versions[-1] == 2, evals  # the start; the end
    assert all(e["metrics"]["tasks"] == 2 for e in evals), evals
    assert not re.search(r"Traceback|Event loop is closed", r.stdout + r.stderr)
