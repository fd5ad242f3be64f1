"""``gspo learn`` started by hand with default settings trains the servers' policy: weight sync
is on (pushes to every registered server), and a learner told ``weight_sync="none"`` while
servers are registered says so loudly at start and on every step line. Real parts: rollout
server (hf engine, uvicorn), redis, the learner's loop."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from gspo_rl.client.client import GSPOClient
from gspo_rl.contract.schema import Keys
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.loop import Learner
from gspo_rl.learner.tracking.metrics import console_line
from gspo_rl.redisq.registry import live_servers
from tests.conftest import RedisServer
from tests.helpers.serving import ADMIN_KEY, API_KEY, Served, running_server

KEYS = Keys()


@pytest.fixture
def served(tiny_model_dir: Path, redis_server: RedisServer) -> Iterator[Served]:
    client = redis.Redis.from_url(redis_server.url)
    with running_server(tiny_model_dir, redis_server.url) as s:
        deadline = time.monotonic() + 30
        while not live_servers(client, KEYS):
            assert time.monotonic() < deadline, "server never registered"
            time.sleep(0.05)
        with GSPOClient(s.url, api_key=API_KEY) as env:
            group = env.rollouts(prompt="hello", n=4, max_tokens=6, temperature=1.0, seed=1)
            env.post_rewards([{"rollout_id": r.rollout_id, "reward": float(i)}
                              for i, r in enumerate(group.rollouts)])
        yield s
    client.close()


def _flags(model: Path, redis_url: str, tmp_path: Path, **extra: object) -> LearnerConfig:
    """The config ``gspo learn --model M --redis-url R --max-steps 1`` builds (no sync flag)."""
    return LearnerConfig.from_toml(None, model=str(model), redis_url=redis_url,
                                   groups_per_step=1, max_steps=1, read_timeout_s=2.0,
                                   admin_key=ADMIN_KEY, console=False,
                                   metrics_jsonl=str(tmp_path / "m.jsonl"), **extra)


def test_defaults_push_weights_to_registered_servers(
        served: Served, tiny_model_dir: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    cfg = _flags(tiny_model_dir, redis_server.url, tmp_path)
    assert cfg.weight_sync == "broadcast" and cfg.lr >= 1e-5
    state = Learner(cfg).run()
    assert (state.step, state.version) == (1, 1)
    assert httpx.get(f"{served.url}/health", timeout=10).json()["policy_version"] == 1


def test_no_sync_with_registered_servers_is_loud(
        served: Served, tiny_model_dir: Path, redis_server: RedisServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    cfg = _flags(tiny_model_dir, redis_server.url, tmp_path, weight_sync="none")
    with caplog.at_level(logging.WARNING):
        Learner(cfg).run()
    text = caplog.text
    assert "weight_sync is 'none' but 1 rollout server(s) are registered" in text
    assert "pushes no weights" in text
    (step,) = [r for r in map(json.loads, (tmp_path / "m.jsonl").read_text().splitlines())
               if r.get("event") == "step"]
    assert step["sync_ok"] is False and "NOT SYNCED" in console_line(step)
    assert httpx.get(f"{served.url}/health", timeout=10).json()["policy_version"] == 0
