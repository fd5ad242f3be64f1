"""POST /v1/rewards and GET /v1/groups/{id} over real HTTP (uvicorn), against a real Redis."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from gspo_rl.contract.schema import Keys
from gspo_rl.learner.algorithm.losses import group_advantages
from gspo_rl.redisq.groups.store import QueueConfig
from tests.conftest import RedisServer
from tests.helpers.queue import ApiServer, make_rollout, open_group, ready_groups

KEYS = Keys()


@pytest.fixture
def api(redis_server: RedisServer) -> Iterator[ApiServer]:
    server = ApiServer(redis_server.url)
    yield server
    server.close()


def post(api: ApiServer, body: Any) -> httpx.Response:
    return httpx.post(f"{api.url}/v1/rewards", json=body, timeout=30)


def post_raw(api: ApiServer, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(f"{api.url}/v1/rewards", content=content, timeout=30,
                      headers={"content-type": "application/json", **headers})


def assert_error(resp: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    if code is not None:
        assert err["code"] == code
    return err


def stream_groups(r: redis.Redis) -> list[Any]:
    return ready_groups(r, KEYS)


def test_200_concurrent_rewards_publish_every_group_once(api: ApiServer, r: redis.Redis) -> None:
    ids = {f"g{g}": api.run(open_group(api.store, f"g{g}", 8)) for g in range(25)}
    rng = random.Random(0)
    rewards = {rid: rng.choice([0.0, 0.25, 0.5, 1.0]) + i * 1e-3
               for g in ids.values() for i, rid in enumerate(g)}
    order = list(rewards)
    rng.shuffle(order)

    async def send_all() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=api.url, limits=limits, timeout=60) as client:
            return await asyncio.gather(*[
                client.post("/v1/rewards", json={"rollout_id": rid, "reward": rewards[rid]})
                for rid in order])

    responses = asyncio.run(send_all())
    assert [resp.status_code for resp in responses] == [200] * 200
    assert sum(resp.json()["results"][0]["group_complete"] for resp in responses) == 25
    published = stream_groups(r)
    assert sorted(g.group_id for g in published) == sorted(ids)  # each group exactly once
    for g in published:
        assert [x.rollout_id for x in g.rollouts] == ids[g.group_id]
        expected = [rewards[rid] for rid in ids[g.group_id]]
        assert g.rewards == expected
        assert g.advantages == pytest.approx(group_advantages(expected).tolist(), abs=1e-6)
        want = make_rollout(ids[g.group_id][3], g.group_id, seed=3)
        assert (g.rollouts[3].token_ids == want.token_ids).all()
    counters = api.run(api.store.counters())
    assert counters["rewards_stored"] == 200 and counters["groups_published"] == 25
    body = httpx.get(f"{api.url}/v1/groups/g7", timeout=10).json()
    assert body["state"] == "published" and body["n_rewarded"] == 8
    assert [x["reward"] for x in body["rollouts"]] == [rewards[rid] for rid in ids["g7"]]


def test_racing_duplicates_store_once_and_publish_once(api: ApiServer, r: redis.Redis) -> None:
    ids = {f"d{g}": api.run(open_group(api.store, f"d{g}", 4)) for g in range(5)}
    items = [(rid, float(i)) for g in ids.values() for i, rid in enumerate(g)]
    posts = [{"rollout_id": rid, "reward": w} for rid, w in items] * 3
    random.Random(1).shuffle(posts)

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=api.url, timeout=60) as client:
            return await asyncio.gather(*[client.post("/v1/rewards", json=p) for p in posts])

    responses = asyncio.run(send_all())
    assert {resp.status_code for resp in responses} == {200}
    statuses = [resp.json()["results"][0]["status"] for resp in responses]
    assert statuses.count("stored") == 20 and statuses.count("duplicate") == 40
    assert sorted(g.group_id for g in stream_groups(r)) == sorted(ids)


def test_list_call_and_idempotency(api: ApiServer, r: redis.Redis) -> None:
    ids = api.run(open_group(api.store, "g", 3))
    body = [{"rollout_id": ids[0], "reward": 1.0, "turn_rewards": [0.5, 0.5]},
            {"rollout_id": ids[1], "reward": 0}]
    resp = post(api, body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert [x["status"] for x in out["results"]] == ["stored", "stored"]
    assert out["stored"] == 2 and out["duplicates"] == 0
    before = api.run(api.store.counters())
    again = post(api, body)  # the same call again: 200, nothing changes
    assert again.status_code == 200
    assert [x["status"] for x in again.json()["results"]] == ["duplicate", "duplicate"]
    after = api.run(api.store.counters())
    assert after["rewards_stored"] == before["rewards_stored"] == 2
    group = httpx.get(f"{api.url}/v1/groups/g", timeout=10).json()
    assert group["state"] == "open" and group["n_rewarded"] == 2 and group["size"] == 3
    assert group["rollouts"][0]["turn_rewards"] == [0.5, 0.5]
    assert group["rollouts"][2] == {"rollout_id": ids[2], "rewarded": False, "reward": None,
                                    "turn_rewards": None}
    assert group["metadata"] == {"prompt": "g"}
    done = post(api, {"rollout_id": ids[2], "reward": 0.25})
    assert done.json()["results"][0]["group_complete"] is True
    assert [g.turn_rewards for g in stream_groups(r)] == [[[0.5, 0.5], None, None]]


def test_conflict_and_unknown_change_nothing(api: ApiServer) -> None:
    ids = api.run(open_group(api.store, "g", 3))
    assert post(api, {"rollout_id": ids[0], "reward": 1.0}).status_code == 200
    err = assert_error(post(api, {"rollout_id": ids[0], "reward": 0.5}), 409, "conflict")
    assert ids[0] in err["message"]
    assert_error(post(api, {"rollout_id": ids[0], "reward": 1.0, "turn_rewards": [1.0]}), 409)
    assert_error(post(api, {"rollout_id": "nope", "reward": 1.0}), 404, "unknown_rollout")
    # A list with one bad item: the status of the first failing item, nothing stored.
    err = assert_error(post(api, [{"rollout_id": ids[1], "reward": 1.0},
                                  {"rollout_id": "nope", "reward": 1.0},
                                  {"rollout_id": ids[0], "reward": 3.0}]), 404, "unknown_rollout")
    assert [x["status"] for x in err["details"]["results"]] == [
        "not_applied", "unknown_rollout", "conflict"]
    assert "item 1" in err["message"] and "nothing in this call was stored" in err["message"]
    # The same rollout twice in one call with two rewards.
    assert_error(post(api, [{"rollout_id": ids[1], "reward": 1.0},
                            {"rollout_id": ids[1], "reward": 2.0}]), 409, "conflict")
    g = api.run(api.store.get_group("g"))
    assert g is not None and g.n_rewarded == 1 and list(g.rewards) == [ids[0]]
    assert g.rewards[ids[0]]["reward"] == 1.0


@pytest.mark.parametrize("raw", [
    b'{"rollout_id": "g-r0", "reward": NaN}',
    b'{"rollout_id": "g-r0", "reward": Infinity}',
    b'{"rollout_id": "g-r0", "reward": -Infinity}',
    b'{"rollout_id": "g-r0", "reward": "1.0"}',
    b'{"rollout_id": "g-r0", "reward": true}',
    b'{"rollout_id": "g-r0", "reward": null}',
    b'{"rollout_id": "g-r0", "reward": 1e300}',
    b'{"rollout_id": "g-r0"}',
    b'{"rollout_id": "", "reward": 1}',
    b'{"rollout_id": 5, "reward": 1}',
    b'{"rollout_id": "g-r0", "reward": 1, "rewrd": 2}',
    b'{"rollout_id": "g-r0", "reward": 1, "turn_rewards": [1, NaN]}',
    b'{"rollout_id": "g-r0", "reward": 1, "turn_rewards": "1"}',
    b'[]',
    b'[{"rollout_id": "g-r0", "reward": 1}, {"rollout_id": "g-r1", "reward": "x"}]',
    b'"just a string"',
    b'42',
])
def test_invalid_bodies_are_422_and_change_nothing(api: ApiServer, raw: bytes) -> None:
    api.run(open_group(api.store, "g", 2))
    err = assert_error(post_raw(api, raw), 422, "invalid_value")
    assert "body" in err["message"]  # says where
    g = api.run(api.store.get_group("g"))
    assert g is not None and g.n_rewarded == 0


def test_invalid_item_message_names_the_field(api: ApiServer) -> None:
    raw = b'[{"rollout_id": "a", "reward": 1}, {"rollout_id": "b", "reward": NaN}]'
    err = assert_error(post_raw(api, raw), 422)
    assert "[1].reward" in err["message"] and "finite" in err["message"]


def test_malformed_json_and_oversized_bodies(api: ApiServer) -> None:
    assert_error(post_raw(api, b'{"rollout_id": "x", "reward": '), 400, "invalid_json")
    too_many = [{"rollout_id": f"r{i}", "reward": 1.0} for i in range(1025)]
    assert_error(post(api, too_many), 422)
    big = json.dumps([{"rollout_id": "x" * 200, "reward": 1.0}] * 6000).encode()
    assert len(big) > 1 << 20
    assert_error(post_raw(api, big), 413, "body_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while streaming
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536]

    resp = httpx.post(f"{api.url}/v1/rewards", content=chunks(), timeout=30,
                      headers={"content-type": "application/json"})
    assert_error(resp, 413, "body_too_large")


def wait_until_due(r: redis.Redis, group_ids: list[str], timeout: float = 20.0) -> None:
    """Waits (bounded) until Redis's clock is past every group's deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        secs, micros = r.time()
        scores = [r.zscore(KEYS.deadlines, g) for g in group_ids]
        if all(s is not None and s < secs + micros / 1e6 for s in scores):
            return
        time.sleep(0.02)
    raise TimeoutError("group deadlines did not pass")


def test_expired_and_partially_finalised_groups_are_410(redis_server: RedisServer,
                                                        r: redis.Redis) -> None:
    config = QueueConfig(group_ttl_s=0.2, min_rewarded_to_finalise=2, finished_ttl_s=30)
    api = ApiServer(redis_server.url, config=config)
    try:
        lone = api.run(open_group(api.store, "lone", 4))
        part = api.run(open_group(api.store, "part", 4))
        # Until the sweeper acts, an open group takes rewards whatever the clock says.
        assert post(api, {"rollout_id": lone[0], "reward": 1.0}).status_code == 200
        assert post(api, [{"rollout_id": part[0], "reward": 1.0},
                          {"rollout_id": part[2], "reward": 0.0}]).status_code == 200
        wait_until_due(r, ["lone", "part"])
        assert api.run(api.store.sweep_once())["expired_finalised"] == 1
        assert_error(post(api, {"rollout_id": lone[1], "reward": 1.0}), 410, "expired")
        assert_error(post(api, {"rollout_id": part[1], "reward": 1.0}), 410, "closed")
        dup = post(api, {"rollout_id": part[0], "reward": 1.0})  # a repeat is still a 200
        assert dup.status_code == 200 and dup.json()["results"][0]["status"] == "duplicate"
        lone_view = httpx.get(f"{api.url}/v1/groups/lone", timeout=10).json()
        assert lone_view["state"] == "expired" and lone_view["drop_reason"] == "expired"
        part_view = httpx.get(f"{api.url}/v1/groups/part", timeout=10).json()
        assert part_view["state"] == "published" and part_view["partial"] is True
        (published,) = stream_groups(r)
        assert [x.rollout_id for x in published.rollouts] == [part[0], part[2]]
        assert published.advantages == pytest.approx([1.0, -1.0], abs=1e-5)
        counters = api.run(api.store.counters())
        assert counters["groups_expired_dropped"] == 1
        assert counters["groups_expired_finalised"] == 1
        assert counters["groups_published_partial"] == 1
        for key in [KEYS.group("lone"), KEYS.rollout(lone[3]), KEYS.rollout(part[1])]:
            assert 0 < r.ttl(key) <= 30
    finally:
        api.close()


def test_unknown_group_and_route_errors(api: ApiServer) -> None:
    assert_error(httpx.get(f"{api.url}/v1/groups/nope", timeout=10), 404, "unknown_group")
    assert_error(httpx.get(f"{api.url}/v1/nothing", timeout=10), 404)
    assert_error(httpx.get(f"{api.url}/v1/rewards", timeout=10), 405)


def test_redis_down_is_503_never_2xx(redis_server: RedisServer) -> None:
    api = ApiServer(redis_server.url)
    try:
        ids = api.run(open_group(api.store, "g", 2))
        redis_server.stop()
        err = assert_error(post(api, {"rollout_id": ids[0], "reward": 1.0}), 503,
                           "redis_unavailable")
        assert "retry" in err["message"]
        redis_server.start()  # no persistence: the data is gone, the server is alive
        assert_error(post(api, {"rollout_id": ids[0], "reward": 1.0}), 404, "unknown_rollout")
    finally:
        api.close()


def test_abandon_ends_a_group_at_once_over_http(api: ApiServer, r: redis.Redis) -> None:
    """``POST /v1/groups/{id}/abandon`` (and the SDK's ``abandon_group``): the group leaves
    the in-flight count now; with enough rewards it is published with them, else dropped;
    again is harmless; an unknown group is a 404."""
    from gspo_rl.client.client import GSPOClient
    from gspo_rl.client.errors import NotFoundError

    empty = api.run(open_group(api.store, "ab-empty", 3))
    half = api.run(open_group(api.store, "ab-half", 3))
    assert post(api, [{"rollout_id": half[0], "reward": 1.0},
                      {"rollout_id": half[1], "reward": 0.0}]).status_code == 200
    assert r.zcard(KEYS.group_activity) == 2
    with GSPOClient(api.url) as client:
        assert client.abandon_group("ab-empty") == {"group_id": "ab-empty", "state": "expired"}
        assert client.abandon_group("ab-half")["state"] == "published"
        assert client.abandon_group("ab-empty")["state"] == "expired"  # again: the same
        assert client.group("ab-empty")["drop_reason"] == "abandoned"
        assert client.group("ab-half")["partial"] is True
        with pytest.raises(NotFoundError):
            client.abandon_group("no-such-group")
    assert r.zcard(KEYS.group_activity) == r.zcard(KEYS.deadlines) == 0
    assert len(stream_groups(r)) == 1
    late = post(api, {"rollout_id": empty[0], "reward": 1.0})
    assert_error(late, 410)
