"""A server restart orphans no admission capacity (issue 35): a real ``gspo serve`` is killed
while the environment holds sampled groups whose rewards it is about to post, and started
again; the learner (``gspo learn``, weight broadcast over gloo) trains again within seconds,
not at the groups' deadline.

Before: the reward posts failed while the server was away, the SDK played the tasks again as
new groups, and the unrewarded groups stayed open, counted in flight, until their deadline
(600 s in compose; ``--group-ttl-s 300`` here): with the bound full (2 here: one group a step,
a staleness of 1), no new group was admitted and the learner trained nothing (measured with
this test and the old behaviour forced: no step within 60 s). Now the SDK retries reward
posts through the restart (they land), a group whose episode fails is abandoned, and an open
group with no activity for ``--group-idle-s`` stops counting. The test counts the seconds
from the restarted server's first healthy answer to the second step trained after the kill
(the first may train a group published before it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

import gspo_rl.client.retry as retry_module
from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.environment import SingleTurnEnvironment
from gspo_rl.client.failures import FailurePolicy, RunStats
from gspo_rl.client.retry import Throttle
from gspo_rl.client.runner import arun_groups
from gspo_rl.contract.schema import Keys
from tests.conftest import RedisServer, free_port
from tests.helpers.serving import ADMIN_KEY, API_KEY

REPO = Path(__file__).resolve().parents[2]
GROUP_TTL_S = 300
IDLE_S = 5
BOUND_S = 60  # far below the group TTL: what the restart may cost at most


class GatedScorer(SingleTurnEnvironment):
    """Scores once ``gate`` is open: the test closes it to hold sampled groups unrewarded
    (``scoring`` says one waits), kills the server, then opens it (the posts then fail)."""

    group_size = 2
    sampling = {"temperature": 1.0, "max_tokens": 4}

    def __init__(self) -> None:
        self.gate, self.scoring = threading.Event(), threading.Event()
        self.gate.set()

    def sample_task(self, rng: random.Random) -> int:
        return rng.randrange(1000)

    def prompt(self, task: int) -> str:
        return f"count {task}"

    def score(self, task: int, completion: str) -> float:
        self.scoring.set()
        assert self.gate.wait(120), "the test never opened the gate"
        return float(len(completion) % 2)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GSPO_")}
    return {**env, "GSPO_API_KEY": API_KEY, "GSPO_ADMIN_KEY": ADMIN_KEY,
            "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def _serve(model: Path, redis_url: str, port: int, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gspo_rl.cli", "serve", "--model", str(model), "--port",
         str(port), "--redis-url", redis_url, "--server-id", "restart-test", "--device", "cpu",
         "--max-n", "2", "--max-tokens", "8", "--group-ttl-s", str(GROUP_TTL_S),
         "--group-idle-s", str(IDLE_S), "--admission-wait-s", "2"],
        cwd=REPO, env=_env(), stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def _learn(model: Path, redis_url: str, tmp: Path, log: Path) -> subprocess.Popen:
    toml = tmp / "learner.toml"
    fields = dict(model=str(model), redis_url=redis_url, save_dir=str(tmp / "ck"),
                  groups_per_step=1, max_staleness=1, save_every=1000, read_timeout_s=0.5,
                  lr=1e-3, device="cpu", console=False, weight_sync="broadcast",
                  sync_timeout_s=15)
    toml.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in fields.items()) + "\n")
    return subprocess.Popen([sys.executable, "-m", "gspo_rl.cli", "learn", "--config", str(toml)],
                            cwd=REPO, env=_env(), stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)


def _wait(cond: Any, what: str, timeout: float, *procs: subprocess.Popen) -> float:
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            assert p.poll() is None, f"{what}: a process exited with {p.returncode}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)
    return time.time()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _steps(jsonl: Path) -> list[dict[str, Any]]:
    if not jsonl.exists():
        return []
    recs = [json.loads(x) for x in jsonl.read_text().splitlines() if x.strip()]
    return [r for r in recs if r.get("event") == "step"]


def _run_env(env: GatedScorer, url: str, stop: asyncio.Event, loop: asyncio.AbstractEventLoop,
             stats: RunStats) -> None:
    async def main() -> None:
        async with AsyncGSPOClient(url, api_key=API_KEY, timeout_s=60) as client:
            await arun_groups(env, client, None, concurrency=4, stop=stop,
                              failures=FailurePolicy(max_consecutive_failures=1000),
                              stats=stats)

    loop.run_until_complete(main())


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_server_restart_costs_seconds_not_the_group_ttl(
        tiny_model_dir: Path, redis_server: RedisServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry_module, "OUTAGE_SAID", Throttle())
    caplog.set_level(logging.WARNING, logger="gspo_rl.client.client")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server_log, learner_log = tmp_path / "server.log", tmp_path / "learner.log"
    jsonl = tmp_path / "ck" / "metrics.jsonl"
    server = _serve(tiny_model_dir, redis_server.url, port, server_log)
    learner = None
    # Two environments, each its own event loop: a score the gate holds blocks its loop, so
    # each holds one group open (one loop could hold only the groups already in flight).
    scorer, stats = GatedScorer(), RunStats()
    loops = [(asyncio.new_event_loop(), asyncio.Event()) for _ in range(2)]
    envs = [threading.Thread(target=_run_env, args=(scorer, url, stop, loop, stats), daemon=True)
            for loop, stop in loops]
    keys = Keys()
    r = redis.Redis.from_url(redis_server.url)
    try:
        _wait(lambda: _healthy(url), "healthy server", 180, server)
        learner = _learn(tiny_model_dir, redis_server.url, tmp_path, learner_log)
        for env in envs:
            env.start()
        _wait(lambda: len(_steps(jsonl)) >= 1, "a trained step", 240, server, learner)
        scorer.scoring.clear()
        scorer.gate.clear()  # sampled groups wait to be scored: the bound (2) fills
        _wait(lambda: scorer.scoring.is_set() and r.zcard(keys.deadlines) >= 2,
              "2 open groups", 120, server, learner)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
        killed_steps = len(_steps(jsonl))
        scorer.gate.set()  # their reward posts now find no server
        time.sleep(3)
        server = _serve(tiny_model_dir, redis_server.url, port, server_log)
        back = _wait(lambda: _healthy(url), "healthy restarted server", 180, server, learner)
        # the first step after the kill may train a group published before it: the second
        _wait(lambda: len(_steps(jsonl)) > killed_steps + 1, "step after the restart",
              BOUND_S, server, learner)
        trained = _steps(jsonl)[killed_steps + 1]["time"]
    finally:
        scorer.gate.set()
        r.close()
        for env, (loop, stop) in zip(envs, loops, strict=True):
            if env.is_alive():
                loop.call_soon_threadsafe(stop.set)
                env.join(timeout=60)
        for p in (learner, server):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
    after = trained - back
    print(f"next trained step {after:.1f} s after the restarted server was healthy")
    assert after < BOUND_S, (after, learner_log.read_text()[-3000:])
    said = [r.getMessage() for r in caplog.records]  # the environment said why it waited
    assert any("POST /v1/rewards" in m and "has not answered" in m for m in said), said
    stalls = [line for line in learner_log.read_text().splitlines()
              if "no training progress (no_groups)" in line]
    assert all("groups in flight (" in line for line in stalls), stalls[:3]
