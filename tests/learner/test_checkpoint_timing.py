"""Issue 35 in the learner's loop, in process: checkpoints by time (``save_every_s``), the
lineage of a resume saved with them, and a weight push's long waits recorded as stalls."""

from __future__ import annotations

import json
import logging

import redis

from gspo_rl.learner.checkpoint.store import list_checkpoints, load_latest
from gspo_rl.learner.loop import Learner
from tests.learner.test_loop import KEYS, RecordingSync, _cfg, publish, sampler  # noqa: F401


def test_save_every_s_checkpoints_between_the_step_checkpoints(tiny_model_dir, redis_url,
                                                               tmp_path, sampler):  # noqa: F811
    client = redis.Redis.from_url(redis_url)
    publish(client, sampler, 4)
    cfg = _cfg(tiny_model_dir, redis_url, tmp_path, save_every=1000, save_every_s=0.001)
    learner = Learner(cfg, client=client, sync=RecordingSync())
    assert learner.run_step() is not None and learner.run_step() is not None
    assert [c.state.step for c in list_checkpoints(tmp_path / "ck")] == [1, 2]
    cfg = _cfg(tiny_model_dir, redis_url, tmp_path / "b", save_every=1000, save_every_s=None)
    publish(client, sampler, 2, seed=10)
    assert Learner(cfg, client=client, sync=RecordingSync()).run_step() is not None
    assert list_checkpoints(tmp_path / "b" / "ck") == []  # steps only: not due


def test_a_resume_gap_is_saved_with_the_next_checkpoint(tiny_model_dir, redis_url, tmp_path,
                                                        sampler):  # noqa: F811
    client = redis.Redis.from_url(redis_url)
    publish(client, sampler, 2)
    Learner(_cfg(tiny_model_dir, redis_url, tmp_path, max_steps=1), client=client,
            sync=RecordingSync()).run()
    client.hset(KEYS.learner_state, "version", 7)  # a dead learner got to version 7
    publish(client, sampler, 2, version=1, seed=20)  # sampled from the checkpoint's weights
    learner = Learner(_cfg(tiny_model_dir, redis_url, tmp_path, resume=True, max_steps=2),
                      client=client, sync=RecordingSync())
    assert learner.version == 8 and learner.reader.lineage.gaps == [(1, 8)]
    rec = learner.run_step()
    assert rec is not None and rec["staleness"] == {"0": 2}  # not 7: the weights are 1's
    learner.run()
    latest = load_latest(tmp_path / "ck")
    assert latest is not None and latest.state.extra["lineage"] == [[1, 8]]


class StallingSync(RecordingSync):
    """A push that waits on a server: it says so through ``on_stall``, as BroadcastSync."""

    def push(self, model, version):  # type: ignore[no-untyped-def]
        self.on_stall(f"weight push of version {version}: broadcasting the buckets for 5 s")
        return super().push(model, version)


def test_a_waiting_push_is_a_stall_record_and_a_warning(tiny_model_dir, redis_url, tmp_path,
                                                        sampler, caplog):  # noqa: F811
    client = redis.Redis.from_url(redis_url)
    publish(client, sampler, 2)
    sync = StallingSync()
    sync.on_stall = print  # replaced by the learner
    with caplog.at_level(logging.WARNING, logger="gspo_rl.learner.runtime.progress"):
        learner = Learner(_cfg(tiny_model_dir, redis_url, tmp_path, max_steps=1),
                          client=client, sync=sync)
        learner.run()
    assert "no training progress (weight_push)" in caplog.text
    recs = [json.loads(x) for x in (tmp_path / "ck" / "metrics.jsonl").read_text().splitlines()]
    stalls = [r for r in recs if r.get("event") == "stall"]
    assert stalls and all(r["reason"] == "weight_push" for r in stalls)
    assert "broadcasting the buckets" in stalls[0]["detail"]
    step = next(r for r in recs if r.get("event") == "step")
    assert step["stalls"].get("weight_push", 0) >= 1
