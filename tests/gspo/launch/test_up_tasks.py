"""`gspo up --tasks`: the whole stack trains on tasks from data and evaluates beside it. The
eval set runs at the first version (the baseline), every N versions and once after training
(when the learner has finished: unrecorded requests are still served); the learner logs the
evaluations it saw in its metrics stream, the one after training too (it waits for it), and its
step records carry per-source rewards."""

from __future__ import annotations

from pathlib import Path

import pytest

from gspo_rl.launch.runlog import read_metrics
from gspo_rl.launch.up import UpConfig, run_up

MATH = Path(__file__).resolve().parents[3] / "clients" / "examples" / "math"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gspo_up_trains_and_evaluates_tasks_from_data(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.toml"
    tasks.write_text(
        (MATH / "tasks.toml").read_text()
        .replace('path = "one_step.jsonl"', f'path = "{MATH / "one_step.jsonl"}"')
        .replace('path = "two_step.jsonl"', f'path = "{MATH / "two_step.jsonl"}"')
        .replace('sources = [{ path = "test.jsonl" }]',
                 f'sources = [{{ path = "{MATH / "test.jsonl"}" }}]\nlimit = 6')
        .replace("every = 5", "every = 2"))
    run_dir = tmp_path / "run"
    result = run_up(UpConfig(run_dir=run_dir, tasks=str(tasks), max_steps=4, minutes=6,
                             target_reward=None, group_size=4))
    evals = read_metrics(run_dir / "evals.jsonl")
    assert len(evals) >= 2, evals  # the baseline and the one after training at least
    assert evals[0]["policy_version"] == 0 and evals[-1]["policy_version"] >= 4
    assert all(e["metrics"]["tasks"] == 6 and "pass@4" in e["metrics"] for e in evals)
    records = read_metrics(run_dir / "metrics.jsonl")
    logged = [r for r in records if r.get("event") == "eval"]
    assert logged and "eval/math/pass@1" in logged[0] and logged[0]["version"] == 0
    (wait,) = [r for r in records if r.get("event") == "final_eval_wait"]
    assert logged[-1]["version"] == wait["version"] == 4  # the final weights', logged
    steps = [r for r in records if r.get("event") == "step"]
    assert len(steps) == 4
    assert all(any(k.startswith("source/") for k in r) for r in steps)
    text = "\n".join(result.summary(0.8))
    assert "source one_step:" in text and "source two_step:" in text and "eval math v0" in text
