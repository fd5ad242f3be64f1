"""``registry_rejected`` in the step records counts the rejected registry entries whichever
path read the registry last (issue 35): the healing check, or the push that reads it every
step (while the learner pushes every step the healing check does not run, and the count stayed
0 although the learner logged ``ignoring registry entry ...``)."""

from __future__ import annotations

import redis

from gspo_rl.learner.loop import Learner
from gspo_rl.learner.weights.broadcast import BroadcastSync
from gspo_rl.redisq.registry import ServerInfo, register
from tests.learner.test_loop import KEYS, _cfg, publish, sampler  # noqa: F401

KEY = "the-admin-key"


def _forged(client: redis.Redis, sid: str) -> None:
    register(client, KEYS, ServerInfo(server_id=sid, url="http://127.0.0.1:9", engine="hf",
                                      model="tiny"), "a-guessed-key", ttl_s=60)


def test_rejected_entries_are_counted_while_the_learner_pushes_every_step(
        tiny_model_dir, redis_url, tmp_path, sampler):  # noqa: F811
    client = redis.Redis.from_url(redis_url)
    publish(client, sampler, 6)
    cfg = _cfg(tiny_model_dir, redis_url, tmp_path, admin_key=KEY, sync_every=1,
               groups_per_step=2)
    sync = BroadcastSync(client, KEYS, admin_key=KEY, timeout_s=5)
    learner = Learner(cfg, client=client, sync=sync)
    try:
        first = learner.run_step()  # the healing check ran first: nothing to reject yet
        assert first is not None and first["registry_rejected"] == 0
        _forged(client, "forged-1")
        _forged(client, "forged-2")
        second, third = learner.run_step(), learner.run_step()
    finally:
        sync.close()
    assert second is not None and third is not None
    assert second["registry_rejected"] == 2 and third["registry_rejected"] == 2
