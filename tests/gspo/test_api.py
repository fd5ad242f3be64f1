"""The Python API (gspo_rl.api): ``import gspo_rl`` is light; the example script starts the
whole system, watches its records and stops it; a learner is started, watched, waited for,
resumed, stopped while it waits for groups, and a broken one fails with its output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import torch
from transformers import AutoModelForCausalLM

import gspo_rl
from gspo_rl.contract.schema import READY_STREAM_FIELD, Keys, pack_ready_group
from tests.helpers.learner_data import sample_group

REPO = Path(__file__).resolve().parents[2]


def test_importing_gspo_rl_and_its_configs_loads_no_torch() -> None:
    probe = ("import json, sys, gspo_rl; gspo_rl.UpConfig, gspo_rl.LearnerConfig, "
             "gspo_rl.LossConfig, gspo_rl.SFTConfig, gspo_rl.ServerSettings, gspo_rl.start_up; "
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
             "{'torch', 'transformers', 'fastapi', 'redis', 'uvicorn'})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    assert json.loads(out.stdout.splitlines()[-1]) == []
    assert {"start_up", "start_learner", "run_up", "UpConfig"} <= set(dir(gspo_rl))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gspo_rl.nope  # noqa: B018


@pytest.mark.timeout(600)
def test_the_example_script_trains_watches_and_stops(tmp_path) -> None:
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "python_api.py"), "--run-dir", str(run_dir),
         "--max-steps", "60", "--stop-after", "2", "--report-to", "tensorboard"],
        capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("step 1: reward") for line in lines), out.stdout
    assert lines.count("stopping") == 1 and lines[-1].startswith("stopped after"), out.stdout
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r.get("event") == "step"]
    # stopped long before its max_steps (a demo step is ~0.1 s: a few train while it stops)
    assert steps[:2] == [1, 2] and max(steps) < 60
    assert lines[-1] == f"stopped after {len(steps)} steps; records in {run_dir}/metrics.jsonl"
    # gspo up passed --report-to to the learner: TensorBoard has every step's loss
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tracking" / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == steps


def _publish(redis_url: str, model_dir: Path, n: int) -> None:
    client = redis.Redis.from_url(redis_url)
    sampler = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    for k in range(n):
        g = sample_group(sampler, group_size=2, prompt_len=3, new_tokens=(2, 4), seed=k)
        client.xadd(Keys().ready_stream, {READY_STREAM_FIELD: pack_ready_group(g)})


@pytest.mark.timeout(600)
def test_a_learner_started_watched_resumed_and_stopped(tiny_model_dir, redis_url,
                                                       tmp_path) -> None:
    _publish(redis_url, tiny_model_dir, 2)
    cfg = gspo_rl.LearnerConfig(model=str(tiny_model_dir), redis_url=redis_url,
                                save_dir=str(tmp_path / "ck"), groups_per_step=1, max_steps=2,
                                read_timeout_s=0.5, weight_sync="none", lr=1e-3)
    run = gspo_rl.start_learner(cfg)
    state = run.wait(timeout=400)
    assert (state.step, state.version) == (2, 2) and run.returncode == 0
    assert [r["step"] for r in run.steps()] == [1, 2]
    events = [r["event"] for r in run.metrics()]
    assert events[0] == "start" and events[-1] == "stop" and "checkpoint" in events

    # resumed with nothing to train: it waits; a wait times out, the run goes on; stop ends
    # it gracefully with its state
    again = gspo_rl.start_learner(cfg.model_copy(update={"resume": True, "max_steps": 5}))
    with again:
        with pytest.raises(TimeoutError):
            again.wait(timeout=3)
        assert again.running
        first = next(again.records())  # this run's records only, not the first run's
        assert first["event"] == "start" and first["resumed_from"] == 2
        state = again.stop()
    assert state.step == 2 and again.returncode == 0

    broken = gspo_rl.start_learner(cfg.model_copy(update={
        "model": str(tmp_path / "no-model"), "save_dir": str(tmp_path / "ck2")}))
    with pytest.raises(gspo_rl.RunFailed, match="no-model"):
        broken.wait(timeout=300)
