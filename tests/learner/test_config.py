"""gspo_rl.learner.config (TOML + overrides) and gspo_rl.learner.tracking.metrics (records, history,
sinks)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from gspo_rl.contract.schema import ReadyGroup
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.tracking.metrics import (
    MetricsLogger,
    console_line,
    reward_stats,
    staleness_histogram,
    trained_history,
)

TOML = """
model = "/models/qwen"
redis_url = "redis://10.0.0.2:6380/1"
groups_per_step = 16
minibatches = 4
lr = 2e-6
betas = [0.9, 0.95]
old_logprobs = "recompute"
max_staleness = 3
save_dir = "/tmp/ck"

[loss]
kind = "gspo"
clip_low = 0.001
"""


def test_toml_then_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(TOML)
    c = LearnerConfig.from_toml(path)
    assert (c.model, c.groups_per_step, c.minibatches, c.lr) == ("/models/qwen", 16, 4, 2e-6)
    assert c.betas == (0.9, 0.95) and c.old_logprobs == "recompute" and c.max_staleness == 3
    assert c.loss.kind == "gspo" and c.loss.clip_low == 0.001 and c.loss.clip_high == 4e-4
    c2 = LearnerConfig.from_toml(path, lr=1e-5, loss="grpo", minibatches=None, resume=True)
    assert c2.lr == 1e-5 and c2.minibatches == 4  # None: flag not passed, TOML value kept
    assert c2.loss.kind == "grpo" and c2.loss.clip_low == 0.001  # kind changed, table kept
    assert c2.loss.clip_high == 0.27 and c2.resume
    assert str(c2.metrics_path) == "/tmp/ck/metrics.jsonl"


@pytest.mark.parametrize("bad", [
    {"lr": 0}, {"minibatches": 0}, {"loss": {"kind": "ppo"}}, {"old_logprobs": "old"},
    {"resume": True}, {"unknown_field": 1}, {"is_weight_cap": -1.0}, {"max_staleness": -1},
])
def test_invalid_values_fail_at_construction(bad):
    with pytest.raises(ValidationError):
        LearnerConfig(model="m", **bad)


def test_every_field_is_documented():
    for name, f in LearnerConfig.model_fields.items():
        assert f.description, name


def test_cli_reports_bad_settings_without_a_traceback(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(TOML)
    r = subprocess.run([sys.executable, "-m", "gspo_rl.cli", "learn", "--config", str(path),
                        "--lr", "-1", "--loss", "ppo"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert "lr" in r.stderr and "loss.kind" in r.stderr and "Traceback" not in r.stderr


def test_metrics_helpers():
    assert staleness_histogram([2, 0, 2, 1, 2]) == {"0": 1, "1": 1, "2": 3}
    g = ReadyGroup("g", [], [0.0, 1.0, 0.5], [0, 0, 0], [None] * 3)
    st = reward_stats([g])
    assert st["reward_mean"] == 0.5 and st["reward_max"] == 1.0
    line = console_line({"step": 3, "version": 3, "loss": 0.1, "staleness": {"0": 2},
                         "dropped": {"dropped_stale": 4}})
    assert "step 3" in line and "dropped 4" in line


def test_trained_history_cuts_steps_that_died_with_their_process(tmp_path):
    path = tmp_path / "m.jsonl"
    m = MetricsLogger(path, console=False)
    m.event({"event": "start", "resumed_from": 0})
    for s in (1, 2, 3):
        m.log({"event": "step", "step": s, "version": s, "group_ids": [f"a{s}"]})
    m.event({"event": "start", "resumed_from": 2})  # crash after step 3; checkpoint at 2
    for s in (3, 4):
        m.log({"event": "step", "step": s, "version": s, "group_ids": [f"b{s}"]})
    m.close()
    hist = trained_history(path)
    assert [(h["step"], h["group_ids"]) for h in hist] == [
        (1, ["a1"]), (2, ["a2"]), (3, ["b3"]), (4, ["b4"])]
    assert all("event" in json.loads(x) for x in path.read_text().splitlines())


def test_by_hand_defaults_bound_staleness_and_turn_admission_on():
    """``gspo learn`` without flags drops stale groups and publishes a bound that turns the
    servers' admission control on (``gspo up`` uses the same bound)."""
    from gspo_rl.contract.admission import capacity
    from gspo_rl.launch.up import UpConfig

    c = LearnerConfig(model="m")
    assert c.max_staleness == UpConfig.model_fields["max_staleness"].default == 2
    assert capacity(c.max_staleness, c.groups_per_step) == 3 * c.groups_per_step


def test_defaults_that_turn_a_mechanism_off_say_so_in_the_help():
    from gspo_rl.cli.options import generate

    learn = generate()["learn"]
    for flag, words in {"max_steps": "never", "target_reward": "no target",
                        "save_dir": "no checkpoints", "warmup_steps": "no warm-up",
                        "weight_decay": "none", "metrics_jsonl": "no metrics file",
                        "report_to": "no tracker", "grad_clip": "disables"}.items():
        assert words in learn[flag]["help"], flag
