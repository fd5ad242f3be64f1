"""A learner crash costs no trained work the data allows (issue 35): the steps since the last
checkpoint are retrained from their redelivered groups, judged against the weights that train
them (the checkpoint's), not dropped as stale against the version the resumed learner takes.

A real ``gspo learn`` (one group a step, a checkpoint every 4 steps, ``max_staleness`` 2) trains
groups published one at a time, each sampled at the learner's version of the moment; it is
SIGKILLed after step 7, three steps past its checkpoint, and resumed. Redelivered: groups 5, 6,
7, sampled at versions 4, 5, 6; the resumed learner labels the checkpoint's weights (version 4)
version 8. Against the checkpoint's weights they are 0, 2 and 4 updates away at their turn: two
retrained, one dropped. Counted against the label (8, 9, ...), as before, 4, 3 and 2: two
dropped, one retrained.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path

import numpy as np
import pytest
import redis

from gspo_rl.learner.tracking.metrics import trained_history
from gspo_rl.redisq.client import make_redis
from gspo_rl.redisq.groups.store import RewardItem, RolloutStore
from tests.learner.test_loop import _spawn, _toml
from tests.system.test_crash import KEYS, _counter, _idle, _rollout, _run_steps, _wait

KILL_AFTER = 7  # steps; the checkpoint is at step 4


async def _publish(redis_url: str, k: int, version: int) -> str:
    client = make_redis(redis_url)
    store = RolloutStore(client, KEYS)
    rng = np.random.default_rng(k)
    gid = f"g{k:03d}"
    try:
        await store.create_group(gid, 2, {"k": k})
        rids = [f"{gid}-r{i}" for i in range(2)]
        for rid in rids:
            await store.record_rollout(_rollout(rid, gid, version, rng))
        await store.post_rewards([RewardItem(rid, float(i)) for i, rid in enumerate(rids)])
    finally:
        await client.aclose()
    return gid


def _records(jsonl: Path) -> list[dict]:
    out = []
    for line in jsonl.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


@pytest.mark.slow
def test_the_unsaved_steps_are_retrained_after_a_sigkill(tiny_model_dir, redis_url, tmp_path):
    client = redis.Redis.from_url(redis_url)
    toml = _toml(tmp_path, tiny_model_dir, redis_url, groups_per_step=1, save_every=4,
                 save_every_s=3600.0, max_staleness=2, read_timeout_s=0.3, lr=1e-4)
    jsonl, log = tmp_path / "ck" / "metrics.jsonl", tmp_path / "learner.log"
    proc = _spawn(toml, log)
    published: list[str] = []
    try:
        for k in range(1, KILL_AFTER + 1):  # group k is sampled at version k - 1
            published.append(asyncio.run(_publish(redis_url, k, k - 1)))
            _wait(lambda k=k: jsonl.exists() and _run_steps(jsonl, 1) >= k, f"step {k}",
                  proc, 120)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc = _spawn(toml, log, "--resume")
        _wait(lambda: _idle(jsonl, 2), "the resumed learner idle", proc, 120)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)

    starts = [r for r in _records(jsonl) if r.get("event") == "start"]
    assert [s["resumed_from"] for s in starts] == [0, 4]
    assert starts[1]["version"] == KILL_AFTER + 1  # past every published version
    history = trained_history(jsonl)
    trained = [g for h in history for g in h["group_ids"]]
    retrained = [g for h in history if h["step"] > 4 for g in h["group_ids"]]
    dropped = _counter(client, "groups_dropped_stale")
    assert retrained == ["g005", "g006"], history
    assert dropped == 1  # g007: sampled 2 updates past the checkpoint, trained 2 after it
    assert trained == published[:6] and len(trained) + dropped == len(published)
    # The step records say how stale each retrained group was, against the trained weights.
    assert [h["staleness"] for h in history if h["step"] > 4] == [{"0": 1}, {"2": 1}]
