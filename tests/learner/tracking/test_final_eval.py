"""The evaluation of the final weights reaches the trackers
(gspo_rl.learner.runtime.final_eval): a real learner, having trained, says it waits (the record
``gspo up`` reads), logs the result posted for its final version to TensorBoard, W&B (offline) and
MLflow, and exits; the wait ends at its bound, or at a stop request, when no result comes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
from transformers import AutoModelForCausalLM

from gspo_rl.contract.schema import READY_STREAM_FIELD, Keys, pack_ready_group
from gspo_rl.launch.watch import WAIT_EVENT as UP_READS
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.loop import Learner
from gspo_rl.learner.runtime.final_eval import WAIT_EVENT, await_final_eval
from gspo_rl.learner.tracking.metrics import MetricsLogger
from gspo_rl.learner.weights.base import NoSync
from gspo_rl.redisq.evals import eval_entry
from tests.helpers.learner_data import sample_group
from tests.helpers.wandb_offline import read_run


def post(client: redis.Redis, name: str, version: int, value: float) -> None:
    """What ``POST /v1/evals`` appends (gspo_rl.server.api.routes.evals)."""
    client.xadd(Keys().eval_stream, eval_entry({"name": name, "policy_version": version,
                                                "metrics": {"pass@1": value},
                                                "time": time.time()}))


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def evaluate_when_asked(client: redis.Redis, metrics: Path, done: threading.Event) -> None:
    """What ``gspo up`` does: on the learner's wait record, evaluate its version and post."""
    while not done.is_set():
        wait = [r for r in records(metrics) if r.get("event") == WAIT_EVENT]
        if wait:
            post(client, "math", wait[0]["version"], 0.75)
            return
        time.sleep(0.2)


@pytest.mark.timeout(240)
def test_the_final_evaluation_reaches_the_trackers(tiny_model_dir, redis_url, tmp_path,
                                                   monkeypatch) -> None:
    assert UP_READS == WAIT_EVENT
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = redis.Redis.from_url(redis_url)
    sampler = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    for k in range(2):
        g = sample_group(sampler, group_size=2, prompt_len=3, new_tokens=(2, 4), seed=k)
        client.xadd(Keys().ready_stream, {READY_STREAM_FIELD: pack_ready_group(g)})
    post(client, "math", 0, 0.25)  # the baseline, logged after the first step
    cfg = LearnerConfig(model=str(tiny_model_dir), redis_url=redis_url,
                        save_dir=str(tmp_path / "ck"), groups_per_step=2, max_steps=1,
                        read_timeout_s=0.5, lr=1e-3, console=False, weight_sync="none",
                        report_to="tensorboard,wandb,mlflow", tracking_project="gspo-test",
                        samples_every=0, final_eval_wait_s=120.0)
    learner = Learner(cfg, client=client, sync=NoSync(client, Keys()))
    done = threading.Event()
    poster = threading.Thread(target=evaluate_when_asked,
                              args=(client, cfg.metrics_path, done), daemon=True)
    poster.start()
    t0 = time.monotonic()
    try:
        learner.run()
    finally:
        done.set()
        poster.join(timeout=10)
    assert time.monotonic() - t0 < 60, "the learner went on waiting after the result came"
    recs = records(cfg.metrics_path)
    events = [r["event"] for r in recs if r.get("event") in ("eval", WAIT_EVENT, "stop")]
    assert events == ["eval", WAIT_EVENT, "eval", "stop"]
    final = [r for r in recs if r.get("event") == "eval"][-1]
    assert final["version"] == 1 and final["eval/math/pass@1"] == 0.75 and final["step"] == 1

    where = tmp_path / "ck" / "tracking"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(where / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("eval/eval/math/pass@1")] == \
        [(1, 0.25), (1, 0.75)]
    (run_dir,) = (where / "wandb").glob("offline-run-*")
    logged = [h["eval/eval/math/pass@1"] for h in read_run(run_dir)["history"]
              if "eval/eval/math/pass@1" in h]
    assert logged[-1] == 0.75
    from mlflow.tracking import MlflowClient

    ml = MlflowClient(f"sqlite:///{where / 'mlflow.db'}")
    (run,) = ml.search_runs([ml.get_experiment_by_name("gspo-test").experiment_id])
    history = ml.get_metric_history(run.info.run_id, "eval/eval/math/pass_1")
    assert sorted(m.value for m in history) == [0.25, 0.75]


@pytest.fixture
def logger(tmp_path: Path) -> MetricsLogger:
    out = MetricsLogger(tmp_path / "m.jsonl", console=False)
    yield out
    out.close()


def test_no_wait_without_final_eval_wait_s_or_after_a_stop(redis_url, logger) -> None:
    client = redis.Redis.from_url(redis_url)
    assert not await_final_eval(client, Keys(), logger, "r", 3, 3, 0.0, lambda: False)
    assert not await_final_eval(client, Keys(), logger, "r", 3, 3, 60.0, lambda: True)
    assert records(logger.jsonl_path) == []


def test_a_result_already_posted_ends_the_wait_at_once(redis_url, logger) -> None:
    client = redis.Redis.from_url(redis_url)
    post(client, "math", 2, 0.5)
    post(client, "code", 3, 0.5)  # the periodic evaluation already saw the final weights
    post(client, "math", 3, 0.5)
    t0 = time.monotonic()
    assert await_final_eval(client, Keys(), logger, "r", 3, 3, 60.0, lambda: False)
    assert time.monotonic() - t0 < 5
    recs = records(logger.jsonl_path)
    assert recs[0] == recs[0] | {"event": WAIT_EVENT, "version": 3, "wait_s": 60.0}
    assert [(r["name"], r["version"]) for r in recs[1:]] == [("math", 2), ("code", 3),
                                                              ("math", 3)]


def test_the_wait_is_bounded_and_a_stop_ends_it(redis_url, logger) -> None:
    client = redis.Redis.from_url(redis_url)
    post(client, "math", 3, 0.5)
    post(client, "code", 2, 0.5)  # one set still lacks version 3
    t0 = time.monotonic()
    assert not await_final_eval(client, Keys(), logger, "r", 3, 3, 1.0, lambda: False)
    assert 1.0 <= time.monotonic() - t0 < 10
    asked = iter([False, False, True])
    t0 = time.monotonic()
    assert not await_final_eval(client, Keys(), logger, "r", 3, 3, 60.0, lambda: next(asked))
    assert time.monotonic() - t0 < 10
