"""The learner loop end to end: a real redis-server, groups sampled from the tiny model on the
ready stream, training, checkpoints, acks, weight pushes, crash and resume."""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import torch
from transformers import AutoModelForCausalLM

from gspo_rl.contract.schema import (
    LEARNER_CONSUMER_GROUP,
    READY_STREAM_FIELD,
    Keys,
    pack_ready_group,
)
from gspo_rl.learner.checkpoint.store import list_checkpoints, load_latest
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.loop import Learner
from gspo_rl.learner.tracking.metrics import trained_history
from tests.helpers.learner_data import sample_group

KEYS = Keys()


@dataclass
class RecordingSync:
    """A WeightSync at the process boundary: records what would be pushed."""

    pushes: list[int] = field(default_factory=list)
    closed: bool = False

    def push(self, model: torch.nn.Module, version: int):
        from gspo_rl.learner.weights.base import NoSyncReport

        self.pushes.append(version)
        return NoSyncReport(version=version, bytes_sent=sum(
            p.numel() * p.element_size() for p in model.parameters()))

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def sampler(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)


def publish(client: redis.Redis, sampler, n: int, version: int = 0, seed: int = 0) -> list[str]:
    """XADD ``n`` ready groups; returns their group ids in stream order."""
    ids = []
    for k in range(n):
        g = sample_group(sampler, group_size=2, prompt_len=3, new_tokens=(2, 5),
                         version=version, seed=seed + k, group_id=f"g{seed + k:03d}")
        client.xadd(KEYS.ready_stream, {READY_STREAM_FIELD: pack_ready_group(g)})
        ids.append(g.group_id)
    return ids


def pending(client: redis.Redis) -> int:
    try:
        return int(client.xpending(KEYS.ready_stream, LEARNER_CONSUMER_GROUP)["pending"])
    except redis.ResponseError:
        return 0


def _cfg(tiny_model_dir, redis_url, tmp_path, **kw) -> LearnerConfig:
    base = dict(model=str(tiny_model_dir), redis_url=redis_url, save_dir=str(tmp_path / "ck"),
                groups_per_step=2, save_every=2, read_timeout_s=0.5, lr=1e-3, console=False)
    return LearnerConfig(**{**base, **kw})


def test_loop_trains_checkpoints_acks_and_pushes(tiny_model_dir, redis_url, tmp_path,
                                                 sampler, caplog):
    client = redis.Redis.from_url(redis_url)
    published = publish(client, sampler, 6)
    sync = RecordingSync()
    learner = Learner(_cfg(tiny_model_dir, redis_url, tmp_path, max_steps=3, sync_every=2),
                      client=client, sync=sync)
    with caplog.at_level(logging.INFO, logger="gspo_rl.learner.loop"):
        state = learner.run()
    # start-up objects out of the collector while it ran (gspo_rl.contract.gc_freeze), back after
    assert "start-up objects frozen out of the garbage collector" in caplog.text
    assert gc.get_freeze_count() == 0
    assert (state.step, state.version, state.groups_trained) == (3, 3, 6)
    assert sync.pushes == [0, 2] and sync.closed  # at start, then every 2 steps
    assert pending(client) == 0  # everything trained was checkpointed, then acked
    assert [c.state.step for c in list_checkpoints(tmp_path / "ck")] == [2, 3]
    latest = load_latest(tmp_path / "ck")
    assert latest is not None and latest.state.version == 3 and len(latest.state.entry_ids) == 2
    st = client.hgetall(KEYS.learner_state)
    assert int(st[b"version"]) == 3 and int(st[b"step"]) == 3
    steps = trained_history(tmp_path / "ck" / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert sorted(g for s in steps for g in s["group_ids"]) == sorted(published)
    assert [s["staleness"] for s in steps] == [{"0": 2}, {"1": 2}, {"2": 2}]
    for s in steps:
        for k in ("reward_mean", "loss", "clip_low_fraction", "clip_high_fraction",
                  "abs_log_ratio_mean", "grad_norm", "tokens_per_s", "time_wait_s",
                  "time_compute_s", "time_sync_s"):
            assert k in s, k
    # the saved model loads as a plain Hugging Face model and differs from the start
    trained = AutoModelForCausalLM.from_pretrained(str(latest.path), dtype=torch.float32)
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(),
                                                     sampler.parameters(), strict=True))


def test_stale_groups_are_dropped_and_counted(tiny_model_dir, redis_url, tmp_path, sampler):
    client = redis.Redis.from_url(redis_url)
    publish(client, sampler, 4)
    cfg = _cfg(tiny_model_dir, redis_url, tmp_path, max_steps=2, max_staleness=0,
               groups_per_step=2, read_timeout_s=0.3)
    learner = Learner(cfg, client=client, sync=RecordingSync())
    first = learner.run_step()
    second = learner.run_step()  # version 1 now: the two remaining version-0 groups are stale
    assert first is not None and first["groups"] == 2
    assert second is None
    assert int(client.hget(KEYS.counters, "groups_dropped_stale")) == 2
    learner.run_step()
    learner.request_stop()
    learner.run()
    last = [json.loads(x) for x in (tmp_path / "ck" / "metrics.jsonl").read_text().splitlines()]
    assert pending(client) == 0 and last[-1]["event"] == "stop"


def _one_step_run(tiny_model_dir, redis_url, tmp_path, sampler) -> redis.Redis:
    """Two groups published and a learner run for one step (its checkpoint in ``ck``);
    returns the Redis client."""
    client = redis.Redis.from_url(redis_url)
    publish(client, sampler, 2)
    Learner(_cfg(tiny_model_dir, redis_url, tmp_path, max_steps=1), client=client,
            sync=RecordingSync()).run()
    return client


def test_resume_moves_past_a_published_version_and_pushes(tiny_model_dir, redis_url,
                                                          tmp_path, sampler):
    client = _one_step_run(tiny_model_dir, redis_url, tmp_path, sampler)
    # a dead learner got further than its checkpoint and pushed version 7 to the servers
    client.hset(KEYS.learner_state, "version", 7)
    sync = RecordingSync()
    learner = Learner(_cfg(tiny_model_dir, redis_url, tmp_path, resume=True, max_steps=1),
                      client=client, sync=sync)
    assert (learner.step, learner.version) == (1, 8) and sync.pushes == [8]


def test_fresh_start_refuses_a_directory_with_checkpoints(tiny_model_dir, redis_url,
                                                          tmp_path, sampler):
    client = _one_step_run(tiny_model_dir, redis_url, tmp_path, sampler)
    with pytest.raises(ValueError, match="--resume"):
        Learner(_cfg(tiny_model_dir, redis_url, tmp_path, max_steps=1), client=client)


# ---------------------------------------------------------------- the real process


def _spawn(toml: Path, log: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "gspo_rl.cli", "learn", "--config", str(toml),
                             *extra], stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            env=env)


def _wait_for_step(jsonl: Path, step: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if jsonl.exists():
            recs = [json.loads(x) for x in jsonl.read_text().splitlines() if x.strip()]
            if any(r.get("event") == "step" and r["step"] >= step for r in recs):
                return
        if proc.poll() is not None:
            raise AssertionError(f"learner exited early with {proc.returncode}")
        time.sleep(0.05)
    raise TimeoutError(f"no step {step} within {timeout}s")


def _toml(tmp_path: Path, tiny_model_dir, redis_url: str, **kw) -> Path:
    fields = {**dict(model=str(tiny_model_dir), redis_url=redis_url,
                     save_dir=str(tmp_path / "ck"), groups_per_step=1, save_every=2,
                     read_timeout_s=0.5, lr=1e-3, device="cpu", console=False), **kw}
    lines = [f"{k} = {json.dumps(v)}" for k, v in fields.items()]
    path = tmp_path / "learner.toml"
    path.write_text("\n".join(lines) + '\n[loss]\nkind = "gspo"\n')
    return path


def test_sigterm_finishes_the_step_checkpoints_and_acks(tiny_model_dir, redis_url, tmp_path,
                                                        sampler):
    client = redis.Redis.from_url(redis_url)
    publish(client, sampler, 12)
    toml = _toml(tmp_path, tiny_model_dir, redis_url, save_every=1000)
    jsonl = tmp_path / "ck" / "metrics.jsonl"
    proc = _spawn(toml, tmp_path / "learner.log")
    try:
        _wait_for_step(jsonl, 2, proc, timeout=180)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    steps = [h["step"] for h in trained_history(jsonl)]
    final = load_latest(tmp_path / "ck")
    assert final is not None and final.state.step == steps[-1]  # checkpointed on the way out
    assert pending(client) == 0  # and acked
    assert int(client.hget(KEYS.learner_state, "step")) == steps[-1]


def test_target_reward_stops_taking_groups_trains_those_in_flight_and_stops(
        tiny_model_dir, redis_url, tmp_path, sampler):
    """At the target (gspo_rl.learner.runtime.target) the learner publishes ``finished``
    (servers start no new group), trains every group still in flight, checkpoints and returns; a
    learner started again clears ``finished``. The totals are what the servers record per finished
    group."""
    client = redis.Redis.from_url(redis_url)
    published = publish(client, sampler, 6)
    cfg = _cfg(tiny_model_dir, redis_url, tmp_path, target_reward=0.8, target_window=4,
               max_steps=50, resume=True)
    learner = Learner(cfg, client=client, sync=RecordingSync())  # baseline: no groups yet
    # Groups the environment scored since: 8 groups of 2, mean 0.875 (trained or not).
    client.hset(KEYS.finished_rewards, mapping={"groups": 8, "rewards": 16, "sum": 14.0})
    state = learner.run()
    # Step 1 met the target; the 4 groups still in flight were trained: 3 steps, not 50.
    assert (state.step, state.groups_trained) == (3, 6)
    assert pending(client) == 0  # checkpointed, then acked
    why = client.hget(KEYS.learner_state, "finished").decode()
    assert why == "target reward 0.8 reached at step 1"
    steps = trained_history(tmp_path / "ck" / "metrics.jsonl")
    assert sorted(g for s in steps for g in s["group_ids"]) == sorted(published)
    assert steps[0]["env_reward"] == 0.875
    Learner(cfg, client=client, sync=RecordingSync())  # started again: takes groups again
    assert client.hget(KEYS.learner_state, "finished") == b""


def test_below_the_target_the_learner_trains_on(tiny_model_dir, redis_url, tmp_path,
                                                sampler):
    client = redis.Redis.from_url(redis_url)
    publish(client, sampler, 6)
    learner = Learner(_cfg(tiny_model_dir, redis_url, tmp_path, target_reward=0.8,
                           target_window=4, max_steps=3),
                      client=client, sync=RecordingSync())
    client.hset(KEYS.finished_rewards, mapping={"groups": 8, "rewards": 16, "sum": 12.0})
    state = learner.run()
    assert state.step == 3 and client.hget(KEYS.learner_state, "finished") == b""
