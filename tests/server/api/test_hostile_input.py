"""Hostile input found in the field (issue 11): every request is bounded and checked before the
server does work for it, and every refusal is a 4xx/503 JSON error that records nothing.
Real uvicorn, real Redis, the hf engine on the tiny model.

Bodies are sent as raw JSON text: ``\\ud800`` escapes and ``NaN`` literals are what a hostile
client sends, and no JSON encoder of a well-behaved client would produce them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gspo_rl.server.rollouts.limits import MAX_METADATA_BYTES, check_metadata, json_problem
from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, MODEL_NAME, RedisKeys, Served, running_server

AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
CHAT, COMPLETIONS, ROLLOUTS, GROUPS = ("/v1/chat/completions", "/v1/completions",
                                       "/v1/rollouts", "/v1/groups")


def deep(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def chat_raw(messages: str, extra: str = "") -> str:
    return f'{{"model":"{MODEL_NAME}","max_tokens":2,"messages":{messages}{extra}}}'


def comp(metadata: str) -> str:
    return f'{{"model":"{MODEL_NAME}","prompt":[1,2,3],"max_tokens":2,"metadata":{metadata}}}'


def group(metadata: str) -> str:
    return f'{{"size":2,"metadata":{metadata}}}'


TOOLS = f',"tools":[{{"type":"function","function":{{"name":"f","parameters":{deep(200)}}}}}]'

# (path, raw JSON body, status, error code)
CASES: list[tuple[str, str, int, str]] = [
    # strings that are not text: 400 before the tokenizer sees them (was a 500)
    (CHAT, chat_raw('[{"role":"user","content":"\\ud800"}]'), 400, "invalid_string"),
    (CHAT, chat_raw('[{"role":"user","content":"hi","name":"a\\udfffb"}]'), 400,
     "invalid_string"),
    (COMPLETIONS, f'{{"model":"{MODEL_NAME}","prompt":"a\\udc00b","max_tokens":2}}', 400,
     "invalid_string"),
    (COMPLETIONS, f'{{"model":"{MODEL_NAME}","prompt":"ab","stop":["\\ud800"]}}', 400,
     "invalid_string"),
    (ROLLOUTS, '{"prompt":"\\ud800","max_tokens":2}', 400, "invalid_string"),
    (GROUPS, '{"size":2,"metadata":{"\\ud800":1}}', 400, "invalid_string"),
    # messages whose role needs content (a TypeError in the chat template, a 500; the
    # message models require it: a 422 naming the field)
    (CHAT, chat_raw('[{"role":"system"},{"role":"user","content":"x"}]'), 422,
     "invalid_value"),
    (CHAT, chat_raw('[{"role":"user"}]'), 422, "invalid_value"),
    (ROLLOUTS, '{"messages":[{"role":"tool"}],"max_tokens":2}', 422, "invalid_value"),
    # nesting: the whole body, and metadata's own tighter bound
    (COMPLETIONS, comp(deep(600)), 400, "too_deep"),
    (GROUPS, group(deep(600)), 400, "too_deep"),
    (ROLLOUTS, '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2' + TOOLS + "}",
     400, "too_deep"),
    (COMPLETIONS, comp(deep(30)), 422, "invalid_value"),
    (GROUPS, group(deep(30)), 422, "invalid_value"),
    # numbers msgpack cannot store or the learner must not see
    (COMPLETIONS, comp('{"x":NaN}'), 422, "invalid_value"),
    (COMPLETIONS, comp('{"x":[1,-Infinity]}'), 422, "invalid_value"),
    (COMPLETIONS, comp('{"x":18446744073709551616}'), 422, "invalid_value"),
    (GROUPS, group('{"x":Infinity}'), 422, "invalid_value"),
    (GROUPS, group('{"x":-9223372036854775809}'), 422, "invalid_value"),
    (CHAT, chat_raw('[{"role":"user","content":"hi"}]', ',"metadata":{"x":NaN}'), 422,
     "invalid_value"),
    # size of metadata, and of a group: refused before any id is built
    (GROUPS, group(json.dumps({"x": "y" * (MAX_METADATA_BYTES + 10)})), 422, "invalid_value"),
    (GROUPS, '{"size":1000000}', 422, "group_too_large"),
    (GROUPS, '{"size":18446744073709551616}', 422, "group_too_large"),
    (GROUPS, f'{{"size":{10**400}}}', 422, "group_too_large"),
]


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, redis_mod: RedisServer) -> Iterator[Served]:
    with running_server(tiny_model_dir, redis_mod.url, max_body_bytes=1 << 20) as s:
        yield s



@pytest.mark.parametrize(("path", "raw", "status", "code"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_hostile_body_is_refused_and_records_nothing(
    served: Served, rkeys: RedisKeys, path: str, raw: str, status: int, code: str,
) -> None:
    before = rkeys.snapshot()
    r = httpx.post(served.url + path, content=raw.encode(), headers=AUTH, timeout=30)
    assert r.status_code == status, r.text[:500]
    err = r.json()["error"]
    assert err["code"] == code, err
    assert err["message"]
    assert rkeys.snapshot() == before
    assert httpx.get(served.url + "/health", timeout=10).status_code == 200


def test_group_size_over_the_bound_answers_at_once(served: Served) -> None:
    """2**64 used to build its id list first (17.9 GB, /health hung): now the refusal comes
    before any work, and a valid group right after is served."""
    r = httpx.post(served.url + GROUPS, json={"size": 2**64}, headers=AUTH, timeout=10)
    assert r.status_code == 422 and "max_group_size" in r.json()["error"]["message"]
    ok = httpx.post(served.url + GROUPS, json={"size": 2, "metadata": {"task": 7}},
                    headers=AUTH, timeout=10)
    assert ok.status_code == 200 and len(ok.json()["rollout_ids"]) == 2


def test_metadata_within_bounds_round_trips(served: Served) -> None:
    meta: dict[str, Any] = {"task": "t-1", "answer": [1, 2.5, None, True],
                            "big": 2**63 - 1, "small": -(2**63), "text": "é🙂",
                            "nested": json.loads(deep(10))}
    r = httpx.post(served.url + GROUPS, json={"size": 2, "metadata": meta}, headers=AUTH,
                   timeout=10)
    assert r.status_code == 200, r.text
    got = httpx.get(f"{served.url}{GROUPS}/{r.json()['group_id']}", headers=AUTH, timeout=10)
    assert got.status_code == 200 and got.json()["metadata"] == meta


def test_limits_unit() -> None:
    assert json_problem(json.loads(deep(64)), 64) is None
    assert "deeper" in (json_problem(json.loads(deep(65)), 64) or "")
    assert json_problem({"k": ["ok", "é"]}, 8) is None
    assert "UTF-8" in (json_problem({"k": ["ok", "\udc80"]}, 8) or "")
    assert "UTF-8" in (json_problem({"\ud800": 1}, 8) or "")
    for bad in ({"x": float("nan")}, {"x": 2**63}, {"x": -(2**63) - 1}, {"x": {1, 2}},
                {"x": "y" * MAX_METADATA_BYTES}):
        with pytest.raises(ValueError, match="metadata"):
            check_metadata(bad)
    assert check_metadata({"x": 2**63 - 1, "y": [1.5, None]}) == {"x": 2**63 - 1,
                                                                 "y": [1.5, None]}


# ------------------------------------------------------------------ Redis out of memory
def _wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def test_redis_out_of_memory_is_503_and_health_degraded(tiny_model_dir: Path,
                                                        redis_server: RedisServer) -> None:
    """At ``maxmemory`` Redis answers pings but refuses writes: the server answers 503 (the SDK
    retries it; a 500 made it drop the reward) and /health reports it."""
    admin = redis.Redis.from_url(redis_server.url)
    with running_server(tiny_model_dir, redis_server.url) as s:
        sampled = httpx.post(s.url + COMPLETIONS, json={"model": MODEL_NAME, "prompt": [1, 2],
                                                        "max_tokens": 2, "n": 2},
                             headers=AUTH, timeout=30).json()
        reward = {"rollout_id": sampled["choices"][0]["rollout_id"], "reward": 1.0}
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
        try:
            for path, body in ((GROUPS, {"size": 2}),
                               (COMPLETIONS, {"model": MODEL_NAME, "prompt": [1, 2],
                                              "max_tokens": 2}),
                               ("/v1/rewards", reward)):
                r = httpx.post(s.url + path, json=body, headers=AUTH, timeout=30)
                assert r.status_code == 503, (path, r.text)
                assert r.json()["error"]["code"] == "redis_out_of_memory"
                assert int(r.headers["Retry-After"]) >= 1
            health = httpx.get(s.url + "/health", timeout=10)
            assert health.status_code == 503
            assert health.json()["status"] == "degraded"
            assert health.json()["redis"] == "out_of_memory"
        finally:
            admin.config_set("maxmemory", "0")
        _wait_for(lambda: httpx.get(s.url + "/health", timeout=10).status_code == 200)
        r = httpx.post(s.url + "/v1/rewards", json=reward, headers=AUTH, timeout=10)
        assert r.status_code == 200 and r.json()["stored"] == 1, r.text
    admin.close()


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/json"])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, GROUPS, "/v1/rewards"])
def test_body_too_deep_for_the_parser_is_4xx(served: Served, path: str,
                                             content_type: str | None) -> None:
    """Deeper than Python's JSON parser can go (a RecursionError), with or without a JSON
    content type: the body checks must not turn it into a 500."""
    headers = {"Authorization": AUTH["Authorization"]}
    if content_type:
        headers["Content-Type"] = content_type
    raw = b"[" * 100_000 + b"]" * 100_000
    r = httpx.post(served.url + path, content=raw, headers=headers, timeout=30)
    assert r.status_code in (400, 422), r.text[:300]
    assert r.json()["error"]["message"]
