"""Exactly-once training across learner crashes, with real processes.

A producer publishes groups through the real ``RolloutStore`` (create, record, reward: the
Lua publish path) while a real ``gspo learn`` process trains them; the learner is SIGKILLed
three times at varying points and restarted with ``--resume``, then stopped with SIGTERM.
Some groups are stamped too old and must be dropped as stale. The audit log (the learner's
metrics JSONL, ``trained_history``) and the Redis counters must then account for every
published group exactly once: trained + dropped == published, nothing twice, nothing lost,
nothing left pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import redis

from gspo_rl.contract.schema import LEARNER_CONSUMER_GROUP, Keys, RolloutRecord
from gspo_rl.learner.tracking.metrics import trained_history
from gspo_rl.redisq.client import make_redis
from gspo_rl.redisq.groups.store import RewardItem, RolloutStore
from tests.learner.test_loop import _spawn, _toml

KEYS = Keys()
N_GROUPS = 48
KILLS = 3
LAGS = (0, 1, 0, 3)  # versions behind the learner a group is stamped; 3 > max_staleness 2


def _rollout(rid: str, gid: str, version: int, rng: np.random.Generator) -> RolloutRecord:
    n, prompt = int(rng.integers(6, 12)), 3
    mask = np.zeros(n, np.uint8)
    mask[prompt:] = 1
    return RolloutRecord(
        rollout_id=rid, group_id=gid, token_ids=rng.integers(10, 1000, n).astype(np.int32),
        loss_mask=mask, logprobs=np.where(mask == 1, -rng.random(n) - 5.0, 0.0).astype(
            np.float32), versions=np.where(mask == 1, version, -1).astype(np.int32),
        prompt_len=prompt, turns=[(prompt, n)], finish_reason="stop")


async def _backlog(client) -> int:
    """Groups not yet delivered to the learner (everything, before it first starts)."""
    if not await client.exists(KEYS.ready_stream):
        return 0
    groups = await client.xinfo_groups(KEYS.ready_stream)
    if not groups:
        return 1 << 30
    last = groups[0]["last-delivered-id"]
    last = last.decode() if isinstance(last, bytes) else last
    return len(await client.xrange(KEYS.ready_stream, f"({last}", "+", count=8))


async def _produce(redis_url: str, stop: threading.Event, out: list[str]) -> None:
    """Publishes ``N_GROUPS`` groups of 2, each stamped a few versions behind the learner,
    keeping at most a few undelivered (no backlog that would all be stale by its turn)."""
    client = make_redis(redis_url)
    store = RolloutStore(client, KEYS)
    rng = np.random.default_rng(0)
    try:
        for k in range(N_GROUPS):
            if stop.is_set():
                return
            while await _backlog(client) >= 4:  # like servers: sample as the learner reads
                if stop.is_set():
                    return
                await asyncio.sleep(0.05)
            current = int(await client.hget(KEYS.learner_state, "version") or 0)
            version = max(0, current - LAGS[k % len(LAGS)])
            gid = f"g{k:03d}"
            await store.create_group(gid, 2, {"k": k})
            rids = [f"{gid}-r{i}" for i in range(2)]
            for rid in rids:
                await store.record_rollout(_rollout(rid, gid, version, rng))
            await store.post_rewards([RewardItem(rid, float(i)) for i, rid in enumerate(rids)])
            out.append(gid)
    finally:
        await client.aclose()


def _run_steps(jsonl: Path, run: int) -> int:
    """Step records written by the ``run``-th learner run (0 until it has started)."""
    if not jsonl.exists():
        return 0
    seen, n = 0, 0
    for line in jsonl.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            event = json.loads(line).get("event")
            seen += event == "start"
            n += event == "step" and seen == run
    return n


def _idle(jsonl: Path, run: int) -> bool:
    """The ``run``-th learner's last step or stall record says it found nothing to read: its
    startup claim is done and the stream had nothing new (what it holds is trained)."""
    seen, last = 0, None
    for line in jsonl.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            rec = json.loads(line)
            seen += rec.get("event") == "start"
            if seen == run and rec.get("event") in ("step", "stall"):
                last = rec
    return last is not None and last.get("reason") == "no_groups"


def _wait(cond, what: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"learner exited with {proc.returncode} while waiting: {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout}s")
        time.sleep(0.05)


def _all_delivered(client: redis.Redis) -> bool:
    last = client.xinfo_stream(KEYS.ready_stream)["last-generated-id"]
    groups = client.xinfo_groups(KEYS.ready_stream)
    return bool(groups) and groups[0]["last-delivered-id"] == last


def _drained(producer: threading.Thread, published: list[str], client: redis.Redis) -> bool:
    """Every group published and delivered: no run after this one would read anything."""
    return not producer.is_alive() and len(published) == N_GROUPS and _all_delivered(client)


def _counter(client: redis.Redis, name: str) -> int:
    return int(client.hget(KEYS.counters, name) or 0)


@pytest.mark.slow
def test_sigkills_and_resumes_train_every_group_exactly_once(tiny_model_dir, redis_url,
                                                            tmp_path):
    client = redis.Redis.from_url(redis_url)
    toml = _toml(tmp_path, tiny_model_dir, redis_url, groups_per_step=2, save_every=3,
                 max_staleness=2, read_timeout_s=0.3, lr=1e-4)
    jsonl, log = tmp_path / "ck" / "metrics.jsonl", tmp_path / "learner.log"
    published: list[str] = []
    stop = threading.Event()
    producer = threading.Thread(target=asyncio.run, args=(_produce(redis_url, stop, published),))
    pick = random.Random(0)
    proc = _spawn(toml, log)
    producer.start()
    kills = 0
    try:
        for k in range(1, KILLS + 1):
            # Kill each run once it has trained a few steps of its own, at a varying point (the
            # producer stays at most 4 groups ahead of the learner, so the kills spread over
            # the run). A run that drains every group first ends the kills: how far one run
            # gets before the test sees it depends on the machine's load, not on the code.
            least = pick.choice((2, 3, 4))
            _wait(lambda n=least, k=k: _run_steps(jsonl, k) >= n or _drained(
                producer, published, client), f"kill {k}: {least} steps trained", proc, 120)
            if _run_steps(jsonl, k) < least:
                break
            time.sleep(pick.uniform(0.0, 0.3))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            kills += 1
            proc = _spawn(toml, log, "--resume")
        producer.join(timeout=120)
        assert not producer.is_alive() and len(published) == N_GROUPS
        _wait(lambda: _all_delivered(client), "every group delivered", proc, 120)
        # SIGTERM once the last learner has read everything (its loop runs, so its signal
        # handlers are installed; a batch it is training is finished and checkpointed).
        _wait(lambda: _idle(jsonl, kills + 1), "the last learner idle", proc, 120)
        proc.send_signal(signal.SIGTERM)  # finish, checkpoint, ack
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        producer.join(timeout=30)

    starts = [json.loads(x) for x in jsonl.read_text().splitlines()
              if x.startswith('{"event": "start"')]
    assert kills >= 2, f"only {kills} kills: the runs drained the groups too fast"
    assert len(starts) == kills + 1
    history = trained_history(jsonl)  # the durable steps: numbered on from each checkpoint
    assert [h["step"] for h in history] == list(range(1, len(history) + 1))
    trained = [g for h in history for g in h["group_ids"]]
    dropped = _counter(client, "groups_dropped_stale") + _counter(
        client, "groups_dropped_invalid")
    assert len(trained) == len(set(trained)), "a group was trained twice"
    assert set(trained) <= set(published)
    assert _counter(client, "groups_published") == N_GROUPS
    assert len(trained) + dropped == N_GROUPS, (len(trained), dropped)  # nothing lost
    assert trained and dropped  # both paths were exercised
    assert int(client.xpending(KEYS.ready_stream, LEARNER_CONSUMER_GROUP)["pending"]) == 0
