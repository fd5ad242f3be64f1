"""The bound on the ready queue (issue 11: a learner paused 60 s let 2,538 groups pile up in
Redis, nothing pushed back). At ``max_ready_groups`` published-but-unacknowledged groups, new
groups are refused with 503 + Retry-After; accepted work (rewards of open groups, turns of
open episodes) goes on and is never lost; the depth is on /metrics. Real uvicorn, real Redis,
the hf engine on the tiny model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gspo_rl.contract.schema import Keys
from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, MODEL_NAME, RedisKeys, Served, running_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
BOUND = 2
USER = [{"role": "user", "content": "hi"}]
NEW_GROUP_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"model": MODEL_NAME, "prompt": [1, 2], "max_tokens": 2, "n": 2}),
    ("/v1/rollouts", {"prompt_token_ids": [1, 2], "max_tokens": 2, "n": 2}),
    ("/v1/chat/completions", {"model": MODEL_NAME, "messages": USER, "max_tokens": 2,
                              "n": 2}),
    ("/v1/groups", {"size": 2}),
]


@pytest.fixture
def served(tiny_model_dir: Path, redis_server: RedisServer) -> Iterator[Served]:
    with running_server(tiny_model_dir, redis_server.url, max_ready_groups=BOUND) as s:
        yield s


def post(served: Served, path: str, body: Any) -> httpx.Response:
    return httpx.post(served.url + path, json=body, headers=AUTH, timeout=60)


def sample_group(served: Served) -> list[str]:
    r = post(served, *NEW_GROUP_REQUESTS[0])
    assert r.status_code == 200, r.text
    return [c["rollout_id"] for c in r.json()["choices"]]


def reward(served: Served, rollout_ids: list[str]) -> None:
    r = post(served, "/v1/rewards", [{"rollout_id": rid, "reward": float(i)}
                                     for i, rid in enumerate(rollout_ids)])
    assert r.status_code == 200, r.text
    assert r.json()["results"][-1]["group_complete"]


def gauge(served: Served, name: str) -> float:
    text = httpx.get(served.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith(name + "_created"))


def test_new_groups_refused_at_the_bound_accepted_work_goes_on(
    served: Served, redis_server: RedisServer,
) -> None:
    keys = Keys()
    episodes = post(served, "/v1/groups", {"size": 2}).json()["rollout_ids"]
    pending = sample_group(served)  # sampled before the bound, rewarded after it
    for _ in range(BOUND):
        reward(served, sample_group(served))
    assert gauge(served, "gspo_ready_queue_depth") == BOUND

    rkeys = RedisKeys(redis_server.url, keys)
    before = rkeys.snapshot()
    for path, body in NEW_GROUP_REQUESTS:
        r = post(served, path, body)
        assert r.status_code == 503, (path, r.text)
        assert r.json()["error"]["code"] == "ready_queue_full"
        assert int(r.headers["Retry-After"]) >= 1
    assert rkeys.snapshot() == before, "a refused request recorded something"
    assert gauge(served, "gspo_ready_queue_refused_total") == len(NEW_GROUP_REQUESTS)

    # Accepted work is never refused: the open group's rewards, the open episodes' turns.
    reward(served, pending)
    for rid in episodes:
        turn = post(served, "/v1/chat/completions", {"model": MODEL_NAME, "messages": USER,
                                                     "max_tokens": 2, "rollout_id": rid})
        assert turn.status_code == 200, turn.text
    reward(served, episodes)
    assert gauge(served, "gspo_ready_queue_depth") == BOUND + 2

    # The learner catches up (acknowledges and trims, as gspo_rl.redisq.ready.reader does):
    # admitted again.
    client = redis.Redis.from_url(redis_server.url)
    client.xtrim(keys.ready_stream, maxlen=0, approximate=False)
    client.close()
    for path, body in NEW_GROUP_REQUESTS:
        assert post(served, path, body).status_code == 200, path
    assert gauge(served, "gspo_ready_queue_depth") == 0
    rkeys.close()


def test_zero_means_no_bound(tiny_model_dir: Path, redis_server: RedisServer) -> None:
    with running_server(tiny_model_dir, redis_server.url, max_ready_groups=0) as s:
        for _ in range(3):
            reward(s, sample_group(s))
        assert post(s, *NEW_GROUP_REQUESTS[0]).status_code == 200
        assert gauge(s, "gspo_ready_queue_depth") == 3


def test_groups_the_learner_dropped_stale_do_not_fill_the_queue(
    served: Served, redis_server: RedisServer,
) -> None:
    """Stale groups are acknowledged on read but stay on the stream until the learner's next
    trim: counting them refused every new group while the learner had nothing to train (a
    deadlock seen in a run without admission control)."""
    from gspo_rl.redisq.ready.reader import GroupReader

    for _ in range(BOUND):
        reward(served, sample_group(served))
    client = redis.Redis.from_url(redis_server.url)
    batch = GroupReader(client, Keys(), max_staleness=0).read_batch(4, 5, timeout_s=1)
    assert batch.groups == [] and batch.dropped_stale == BOUND
    assert client.xlen(Keys().ready_stream) == BOUND  # acknowledged, not yet trimmed
    client.close()
    for path, body in NEW_GROUP_REQUESTS:
        assert post(served, path, body).status_code == 200, path
