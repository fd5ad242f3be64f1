"""Experiment tracking (gspo_rl.learner.tracking): records as scalars, the fan-out, the missing
extra named at start, and a real learner reporting to TensorBoard, W&B (offline mode, its run
file read back), MLflow (a local SQLite store) and the Prometheus exporter at once: scalars,
and tables of sampled episodes."""

from __future__ import annotations

import json
import logging
import math
import subprocess
from pathlib import Path

import pytest
import redis
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from gspo_rl.cli import app
from gspo_rl.contract.schema import READY_STREAM_FIELD, Keys, pack_ready_group
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.loop import Learner
from gspo_rl.learner.tracking import backends, base
from gspo_rl.learner.tracking.backends import mlflow_key
from gspo_rl.learner.tracking.base import Tracker, TrackingUnavailable, check_installed, flatten
from gspo_rl.learner.tracking.prometheus import PREFIX, PrometheusBackend
from gspo_rl.learner.tracking.run_info import code_tags
from gspo_rl.learner.tracking.samples import COLUMNS
from gspo_rl.learner.weights.base import NoSync
from tests.helpers.learner_data import sample_group
from tests.helpers.wandb_offline import read_run

REPO = Path(__file__).resolve().parents[3]


def test_records_become_namespaced_scalars() -> None:
    step = {"event": "step", "step": 3, "version": 3, "time": 1.0, "run_id": "r", "loss": 0.5,
            "sync_ok": True, "staleness": {"0": 2, "1": 1}, "dropped": {"dropped_stale": 4},
            "group_ids": ["a"], "env_reward": None}
    assert flatten(step) == {"train/version": 3.0, "train/loss": 0.5, "train/sync_ok": 1.0,
                             "train/staleness/0": 2.0, "train/staleness/1": 1.0,
                             "train/dropped/dropped_stale": 4.0}
    stall = {"event": "stall", "reason": "no_groups", "detail": "empty", "for_s": 30.0}
    assert flatten(stall) == {"stall/no_groups/for_s": 30.0}
    ev = {"event": "eval", "version": 4, "sources": {"math": {"pass@1": 0.25}}}
    assert flatten(ev) == {"eval/version": 4.0, "eval/sources/math/pass@1": 0.25}
    assert mlflow_key("eval/sources/math/pass@1") == "eval/sources/math/pass_1"


class _Raising:
    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.calls += 1
        raise OSError("disk full")

    def close(self) -> None:
        raise OSError("disk full")


def test_a_failing_tracker_is_logged_once_and_never_raises(caplog) -> None:
    broken = _Raising()
    tracker = Tracker([broken])
    with caplog.at_level(logging.WARNING):
        for s in range(3):
            tracker.log({"event": "step", "loss": 1.0}, s)
        tracker.log({"event": "start", "run_id": "x"}, 0)  # no scalar: not sent
        tracker.close()
    assert broken.calls == 3
    assert sum("tracker broken failed" in r.message for r in caplog.records) == 1


def test_a_missing_tracker_names_its_extra(monkeypatch, tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown tracker 'neptune'"):
        check_installed(["neptune"])
    monkeypatch.setitem(base.REQUIREMENTS, "wandb", (("no_such_module_gspo",), "wandb"))
    with pytest.raises(TrackingUnavailable, match=r"pip install 'gspo-rl\[wandb\]'"):
        check_installed(["tensorboard", "wandb"])
    # gspo learn stops before loading anything, with that hint and no traceback
    out = CliRunner().invoke(app, ["learn", "--model", str(tmp_path / "none"),
                                   "--report-to", "tensorboard,wandb"])
    assert out.exit_code == 2
    assert "gspo-rl[wandb]" in out.output and "Traceback" not in out.output
    with pytest.raises(TrackingUnavailable):  # the Python entry too, before any model load
        Learner(LearnerConfig(model=str(tmp_path / "none"), report_to="wandb"))
    with pytest.raises(ValueError, match="report_to"):
        LearnerConfig(model="m", report_to="tensorboard,neptune")
    assert LearnerConfig(model="m", report_to=" wandb,mlflow,wandb ").report_to == [
        "wandb", "mlflow"]


def _git_head() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


class _KeptPrometheus(PrometheusBackend):
    """The exporter, kept after the run to read its registry."""

    opened: list[PrometheusBackend] = []

    def __init__(self, info: base.RunInfo) -> None:
        super().__init__(info)
        self.opened.append(self)


def _gauges(exporter: PrometheusBackend) -> dict[str, float]:
    return {s.name.removeprefix(PREFIX): s.value for fam in exporter.registry.collect()
            for s in fam.samples if not s.labels}


@pytest.mark.timeout(240)
def test_a_learner_reports_every_record_to_four_trackers(tiny_model_dir, redis_url, tmp_path,
                                                         monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setitem(backends.BACKENDS, "prometheus", _KeptPrometheus)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(REPO)  # the run's git commit is this checkout's
    client = redis.Redis.from_url(redis_url)
    sampler = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    for k in range(4):
        g = sample_group(sampler, group_size=2, prompt_len=3, new_tokens=(2, 4), seed=k)
        client.xadd(Keys().ready_stream, {READY_STREAM_FIELD: pack_ready_group(g)})
    cfg = LearnerConfig(model=str(tiny_model_dir), redis_url=redis_url,
                        save_dir=str(tmp_path / "ck"), groups_per_step=2, save_every=1,
                        max_steps=2, read_timeout_s=0.5, lr=1e-3, console=False,
                        weight_sync="none", report_to="tensorboard,wandb,mlflow,prometheus",
                        run_name="tracked", tracking_project="gspo-test", samples_every=1,
                        prometheus_port=0)
    Learner(cfg, client=client, sync=NoSync(client, Keys())).run()
    where = tmp_path / "ck" / "tracking"
    assert cfg.tracking_path == where
    commit = _git_head()
    assert code_tags()["git_commit"] == commit

    # TensorBoard: every step's loss, the checkpoint events, the config as text
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(where / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2]
    assert [e.step for e in acc.Scalars("checkpoint/time_checkpoint_s")] == [1, 2]
    assert "run/text_summary" in acc.Tags()["tensors"]
    tables = acc.Tensors("samples/text_summary")  # the sampled episodes, a Markdown table
    assert [t.step for t in tables] == [1, 2]
    text = tables[0].tensor_proto.string_val[0].decode()
    assert text.startswith("| " + " | ".join(COLUMNS) + " |") and len(text.splitlines()) == 4

    # W&B, offline: the run file holds the config, the commit and every step
    (run_dir,) = (where / "wandb").glob("offline-run-*")
    wb = read_run(run_dir)
    assert wb["run"].display_name == "tracked" and wb["run"].project == "gspo-test"
    assert wb["config"]["lr"] == 1e-3 and wb["config"]["loss"]["kind"] == "gspo"
    assert wb["config"]["git_commit"] == commit and "admin_key" not in wb["config"]
    losses = {h["_step"]: h["train/loss"] for h in wb["history"] if "train/loss" in h}
    assert sorted(losses) == [1, 2] and all(math.isfinite(v) for v in losses.values())
    tables = {h["_step"]: h for h in wb["history"] if "samples/path" in h}  # nested keys
    assert sorted(tables) == [1, 2] and tables[1]["samples/_type"] == "table-file"
    table = json.loads((run_dir / "files" / tables[1]["samples/path"]).read_text())
    assert table["columns"] == list(COLUMNS) and len(table["data"]) == 2
    assert {r[1] for r in table["data"]} <= set(_group_ids(where.parent / "metrics.jsonl"))

    # MLflow, a SQLite store in the tracking directory
    from mlflow.tracking import MlflowClient

    ml = MlflowClient(f"sqlite:///{where / 'mlflow.db'}")
    (run,) = ml.search_runs([ml.get_experiment_by_name("gspo-test").experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert run.data.params["lr"] == "0.001" and run.data.params["loss.kind"] == "gspo"
    assert run.data.tags["git_commit"] == commit and run.data.tags["kind"] == "learn"
    history = ml.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in history] == [1, 2]
    assert [m.value for m in history] == pytest.approx(list(losses.values()))
    names = [a.path for a in ml.list_artifacts(run.info.run_id, "samples")]
    assert names == ["samples/step_000001.json", "samples/step_000002.json"]
    saved = json.loads(Path(ml.download_artifacts(run.info.run_id, names[0],
                                                  str(tmp_path))).read_text())
    assert saved["step"] == 1 and saved["columns"] == list(COLUMNS)
    assert len(saved["rows"]) == 2 and saved["rows"][0]["completion"]

    # Prometheus: the gauges hold the last step's values
    (exporter,) = _KeptPrometheus.opened
    gauges = _gauges(exporter)
    assert gauges["step"] == 2 and gauges["policy_version"] == 2
    assert gauges["loss"] == pytest.approx(losses[2])
    for name in ("reward_trained", "clip_fraction", "grad_norm", "tokens_per_second",
                 "trained_group_fraction", "trained_token_fraction", "groups_trained",
                 "staleness_mean", "step_seconds", "is_weight_capped_fraction"):
        assert math.isfinite(gauges[name]), name


def _group_ids(jsonl: Path) -> list[str]:
    return [g for line in jsonl.read_text().splitlines()
            for g in json.loads(line).get("group_ids", [])]
