"""The loop heals without a person: restarted servers get the weights again, Redis restarts
are survived (bounded), and every state without progress is logged and recorded.

Real parts: redis-server (with AOF where it restarts), the rollout server (hf engine, uvicorn)
and the learner in this process (its ``run`` on a thread, stopped with ``request_stop``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
import torch
from transformers import AutoModelForCausalLM

from gspo_rl.contract.schema import READY_STREAM_FIELD, Keys, pack_ready_group
from gspo_rl.learner.checkpoint.store import load_latest
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.loop import Learner
from gspo_rl.learner.runtime.progress import RedisUnavailable
from gspo_rl.learner.weights.base import NoSyncReport
from gspo_rl.redisq.registry import ServerInfo, live_servers, register
from tests.conftest import RedisServer, wait_until
from tests.helpers.learner_data import sample_group
from tests.helpers.serving import ADMIN_KEY, running_server

KEYS = Keys()


@pytest.fixture(scope="module")
def sampler(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)


def _publish(client: redis.Redis, sampler, n: int, version: int, seed: int) -> None:
    for k in range(n):
        g = sample_group(sampler, group_size=2, prompt_len=3, new_tokens=(2, 4),
                         version=version, seed=seed + k, group_id=f"g{seed + k}")
        client.xadd(KEYS.ready_stream, {READY_STREAM_FIELD: pack_ready_group(g)})


def _cfg(tiny_model_dir, redis_url: str, tmp_path: Path, **kw) -> LearnerConfig:
    base = dict(model=str(tiny_model_dir), redis_url=redis_url, groups_per_step=1,
                read_timeout_s=0.3, lr=1e-4, console=False, device="cpu",
                metrics_jsonl=str(tmp_path / "metrics.jsonl"))
    return LearnerConfig(**{**base, **kw})


class Running:
    """``gspo_rl.learner.run()`` on a thread; ``stop`` requests a graceful stop and joins."""

    def __init__(self, learner: Learner) -> None:
        self.learner, self.error = learner, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.learner.run()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc

    def stop(self) -> None:
        self.learner.request_stop()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


def _health_version(url: str) -> int:
    try:
        return int(httpx.get(f"{url}/health", timeout=5).json()["policy_version"])
    except httpx.HTTPError:
        return -2


def test_a_restarted_server_gets_the_weights_while_nothing_is_trained(
        tiny_model_dir, redis_url, tmp_path, sampler):
    client = redis.Redis.from_url(redis_url)
    cfg = _cfg(tiny_model_dir, redis_url, tmp_path, weight_sync="broadcast",
               admin_key=ADMIN_KEY, sync_timeout_s=30)
    with running_server(tiny_model_dir, redis_url) as served:
        wait_until(lambda: len(live_servers(client, KEYS)) == 1, "server registered", 60)
        learner = Learner(cfg, client=client)
        run = Running(learner)
        try:
            _publish(client, sampler, 2, version=0, seed=0)
            wait_until(lambda: learner.step == 2 and _health_version(served.url) == 2,
                       "2 steps trained and pushed", 60)
        except BaseException:
            run.stop()
            raise
    try:
        # The server restarts (same id, back at version 0); no group arrives: the learner
        # must notice from the heartbeat and push on its own.
        with running_server(tiny_model_dir, redis_url) as again:
            wait_until(lambda: _health_version(again.url) == 2, "the restarted server healed",
                       60)
            assert learner.step == 2 and run.error is None
    finally:
        run.stop()


def test_the_learner_waits_for_redis_and_survives_its_restart(
        tiny_model_dir, redis_aof_server: RedisServer, tmp_path, sampler, caplog):
    url = redis_aof_server.url
    redis_aof_server.stop()
    cfg = _cfg(tiny_model_dir, url, tmp_path, save_dir=str(tmp_path / "ck"), save_every=1,
               redis_retry_s=60)
    made: list[Learner] = []
    starting = threading.Thread(target=lambda: made.append(Learner(cfg)), daemon=True)
    with caplog.at_level(logging.WARNING, logger="gspo_rl.learner.runtime.progress"):
        starting.start()  # Redis is down: the learner waits (bounded) instead of exiting
        time.sleep(1.5)
        redis_aof_server.start()
        starting.join(timeout=120)
        assert made, "the learner did not come up after Redis did"
        learner = made[0]
        client = redis.Redis.from_url(url)
        run = Running(learner)
        try:
            _publish(client, sampler, 2, version=0, seed=0)
            wait_until(lambda: learner.step == 2, "2 steps", 60)
            redis_aof_server.restart()
            _publish(redis.Redis.from_url(url), sampler, 2, version=learner.version, seed=10)
            wait_until(lambda: learner.step == 4, "2 more steps after the Redis restart", 60)
        finally:
            run.stop()
    assert run.error is None
    assert any("redis_down" in r.getMessage() for r in caplog.records)
    stalls = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
              if '"stall"' in x]
    assert {s["reason"] for s in stalls} >= {"redis_down"}


def test_redis_gone_for_good_ends_the_run_after_the_bound_and_keeps_the_steps(
        tiny_model_dir, redis_server: RedisServer, tmp_path, sampler):
    client = redis.Redis.from_url(redis_server.url)
    cfg = _cfg(tiny_model_dir, redis_server.url, tmp_path, save_dir=str(tmp_path / "ck"),
               save_every=100, redis_retry_s=3)
    learner = Learner(cfg, client=client)
    run = Running(learner)
    _publish(client, sampler, 2, version=0, seed=0)
    wait_until(lambda: learner.step == 2, "2 steps", 60)
    redis_server.stop()
    run.thread.join(timeout=120)
    assert isinstance(run.error, RedisUnavailable)
    saved = load_latest(tmp_path / "ck")  # the trained steps were checkpointed on the way out
    assert saved is not None and saved.state.step == 2 and len(saved.state.entry_ids) == 2


@dataclass
class FailingSync:
    """A WeightSync at the process boundary whose pushes never reach a server."""

    pushes: list[int] = field(default_factory=list)

    def push(self, model: torch.nn.Module, version: int) -> NoSyncReport:
        self.pushes.append(version)
        return NoSyncReport(version=version, ok=False)

    def close(self) -> None:
        return None


def test_every_no_progress_state_is_warned_once_and_recorded(
        tiny_model_dir, redis_url, tmp_path, sampler, caplog):
    client = redis.Redis.from_url(redis_url)
    client.hset(KEYS.learner_state, "version", 10)  # a previous learner got to version 10
    sync = FailingSync()
    learner = Learner(_cfg(tiny_model_dir, redis_url, tmp_path, max_staleness=2,
                           admin_key=ADMIN_KEY), client=client, sync=sync)
    assert learner.version == 11 and sync.pushes == [11]  # pushed at start
    # Sampled at 5, by weights that died with the previous learner: 5 updates from this
    # one's (the initial weights, labelled 11): all stale (lineage.py)
    _publish(client, sampler, 3, version=5, seed=0)
    with caplog.at_level(logging.WARNING, logger="gspo_rl.learner.runtime.progress"):
        for _ in range(4):
            assert learner.run_step() is None
        learner.healer.last_check = 0.0  # due now (not 5 s after the start-up push)
        learner._heal()  # no server registered
        learner.healer.last_check = 0.0
        register(client, KEYS, ServerInfo(server_id="s", url="http://127.0.0.1:9",
                                           engine="hf", model="m", policy_version=0),
                 ADMIN_KEY)
        learner._heal()  # a server behind the learner, and the push fails
    warned = [r.getMessage() for r in caplog.records]
    for reason in ("all_stale", "no_groups", "no_servers", "servers_behind"):
        assert sum(f"({reason})" in m for m in warned) == 1, (reason, warned)
    assert sync.pushes == [11, 11]
    _publish(client, sampler, 1, version=11, seed=5)
    rec = learner.run_step()
    assert rec is not None and rec["stalls"] == {
        "all_stale": 1, "no_groups": 3, "no_servers": 1, "servers_behind": 1}
    events = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
              if '"stall"' in x]
    assert [e["reason"] for e in events] == ["all_stale", "no_groups", "no_servers",
                                             "servers_behind"]


def test_gspo_learn_exits_75_with_a_message_when_redis_never_answers(tiny_model_dir,
                                                                     tmp_path):
    from tests.conftest import free_port
    from tests.learner.test_loop import _spawn, _toml

    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    toml = _toml(tmp_path, tiny_model_dir, dead, redis_retry_s=2)
    log = tmp_path / "learner.log"
    proc = _spawn(toml, log)
    try:
        assert proc.wait(timeout=180) == 75, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "learner stopped: Redis unreachable" in text and "(redis_down)" in text


def test_a_server_state_is_not_warned_again_by_each_trained_step(tmp_path, caplog):
    from gspo_rl.learner.runtime.progress import ProgressMonitor
    from gspo_rl.learner.tracking.metrics import MetricsLogger

    monitor = ProgressMonitor(MetricsLogger(tmp_path / "m.jsonl", console=False))
    with caplog.at_level(logging.WARNING, logger="gspo_rl.learner.runtime.progress"):
        for _ in range(3):  # training goes on from a backlog while no server is registered
            monitor.stalled("no_servers", "none registered")
            monitor.stalled("no_groups", "empty")
            assert monitor.progressed()["stalls"] == {"no_servers": 1, "no_groups": 1}
    warned = [r.getMessage() for r in caplog.records]
    assert sum("(no_servers)" in m for m in warned) == 1  # once per interval, not per step
    assert sum("(no_groups)" in m for m in warned) == 3  # a trained step ends that state
    monitor.clear("no_servers")
    with caplog.at_level(logging.WARNING, logger="gspo_rl.learner.runtime.progress"):
        monitor.stalled("no_servers", "gone again")
    assert sum("(no_servers)" in r.getMessage() for r in caplog.records) == 2
