"""Requests served and not recorded (``"record": false``): evaluation and inference traffic at
any time. Nothing reaches Redis (no group, no rollout, no counter), admission is bypassed (no
room: the learner is far ahead, so every recorded request is held then refused), the learner's
``training_finished`` does not refuse them, greedy sampling is allowed, and token ids and
log-probabilities still come back; an episode's turn cannot opt out. Also ``GET /v1/models``
and ``/v1/evals``. Real uvicorn, real Redis, hf engine on the tiny model, the openai client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gspo_rl.contract.schema import Keys
from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, MODEL_NAME, RedisKeys, Served, running_server
from tests.server.rollouts.test_admission import learner_publishes

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "user", "content": "Say a word."}]


def no_room(redis_url: str, model: Path, finished: str = "") -> None:
    """A learner 10 versions ahead of the server with a staleness bound of 1: the admission
    bound is below zero, so every new group is held (``admission_wait_s``) then refused."""
    learner_publishes(redis_url, model, max_staleness=1, groups_per_step=1, version=10,
                      finished=finished)


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, redis_mod: RedisServer) -> Iterator[Served]:
    no_room(redis_mod.url, tiny_model_dir)
    with running_server(tiny_model_dir, redis_mod.url, admission=True,
                        admission_wait_s=0.2) as s:
        yield s


def post(served: Served, path: str, body: dict) -> httpx.Response:
    return httpx.post(served.url + path, json=body, headers=AUTH, timeout=60)


def test_unrecorded_requests_are_served_and_leave_redis_untouched(
        served: Served, client: openai.OpenAI, rkeys: RedisKeys) -> None:
    before = rkeys.snapshot()
    chat = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4,
                                          n=2, logprobs=True, extra_body={"record": False})
    assert chat.group_id is None  # type: ignore[attr-defined]
    assert chat.id.startswith("chatcmpl-") and len(chat.choices) == 2
    for c in chat.choices:
        extra = c.model_extra or {}
        assert extra["rollout_id"] is None and len(extra["token_ids"]) >= 1
        assert len(c.logprobs.content) == len(extra["token_ids"])  # type: ignore[union-attr]
    done = client.completions.create(model=MODEL_NAME, prompt="Once", max_tokens=3,
                                     logprobs=1, extra_body={"record": False})
    assert done.choices[0].logprobs is not None and done.model_extra["group_id"] is None
    r = post(served, "/v1/rollouts", {"prompt": "Hi", "n": 3, "max_tokens": 3,
                                      "record": False})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["group_id"] is None and len(body["rollouts"]) == 3
    assert all(x["rollout_id"] is None and len(x["logprobs"]) == len(x["token_ids"])
               for x in body["rollouts"])
    stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4,
                                            stream=True, extra_body={"record": False})
    chunks = list(stream)
    assert chunks and all(ch.model_extra["group_id"] is None for ch in chunks)
    assert rkeys.snapshot() == before  # no key, no counter


def test_recorded_requests_are_refused_at_once_without_a_learner(served: Served) -> None:
    r = post(served, "/v1/rollouts", {"prompt": "Hi", "n": 2, "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_learner_connected"


def test_a_plain_chat_call_is_served_unrecorded_and_says_so(served: Served,
                                                            rkeys: RedisKeys) -> None:
    """One sample, no rollout_id, no "record" (what an OpenAI tool sends): recorded, it would be
    a one-sample group (never any signal) held by admission here; it is served at once,
    nothing written, and the GSPO-Recorded header says why. Asked for, it is recorded."""
    before = rkeys.snapshot()
    plain = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 3}
    for body in (plain, {**plain, "n": 1}, {**plain, "stream": True}):
        r = post(served, "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        note = r.headers["GSPO-Recorded"]
        assert note.startswith("false;") and "one-sample group never trains" in note
    assert r.text.count('"rollout_id":null') == 1  # the stream's final chunk
    assert rkeys.snapshot() == before
    for body in ({**plain, "n": 2}, {**plain, "record": True}):
        r = post(served, "/v1/chat/completions", body)
        assert r.status_code == 503 and "GSPO-Recorded" not in r.headers, body


def test_greedy_is_allowed_unrecorded(served: Served) -> None:
    """(Recorded, it is a 400 ``temperature_zero``: tests/server/rollouts/test_episodes.py.)"""
    greedy = {"prompt": "Hi", "n": 2, "max_tokens": 4, "temperature": 0}
    r = post(served, "/v1/rollouts", {**greedy, "record": False})
    assert r.status_code == 200, r.text
    a, b = (x["token_ids"] for x in r.json()["rollouts"])
    assert a == b  # greedy: both samples take the most likely token every time


def test_an_episode_turn_cannot_opt_out(served: Served) -> None:
    r = post(served, "/v1/chat/completions", {"model": MODEL_NAME, "messages": MESSAGES,
                                              "rollout_id": "abc", "record": False})
    assert r.status_code == 400 and "always recorded" in r.json()["error"]["message"]


def test_served_after_training_finished(served: Served, redis_mod: RedisServer,
                                        tiny_model_dir: Path, rkeys: RedisKeys) -> None:
    no_room(redis_mod.url, tiny_model_dir, finished="target reward 0.8 reached at step 3")
    try:
        r = post(served, "/v1/rollouts", {"prompt": "Hi", "n": 2, "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "training_finished"
        before = rkeys.snapshot()
        r = post(served, "/v1/chat/completions", {"model": MODEL_NAME, "messages": MESSAGES,
                                                  "max_tokens": 3, "record": False})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"]
        assert rkeys.snapshot() == before
    finally:
        no_room(redis_mod.url, tiny_model_dir)


def test_models_with_the_openai_client(client: openai.OpenAI, served: Served) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    card = client.models.retrieve(MODEL_NAME)
    assert card.owned_by == "gspo-rl" and card.model_extra["max_model_len"] > 0
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")
    assert httpx.get(served.url + "/v1/models", timeout=10).status_code == 401


def test_evals_are_appended_to_the_results_stream(served: Served, rkeys: RedisKeys) -> None:
    body = {"name": "math", "policy_version": 4,
            "metrics": {"mean_reward": 0.25, "pass@1": 0.25, "pass@4": 0.5}}
    r = post(served, "/v1/evals", body)
    assert r.status_code == 200, r.text
    first = r.json()["id"]
    raw = rkeys.client.xrange(Keys().eval_stream)
    assert json.loads(raw[-1][1][b"eval"])["metrics"]["pass@4"] == 0.5
    r = post(served, "/v1/evals", {**body, "policy_version": 5})
    listed = httpx.get(served.url + "/v1/evals", params={"after": first}, headers=AUTH,
                       timeout=10).json()["evals"]
    assert [e["policy_version"] for e in listed] == [5]
    for bad in ({**body, "metrics": {"x": float("nan")}}, {**body, "name": "a b"},
                {**body, "metrics": {}}, {**body, "extra": 1}):
        r = httpx.post(served.url + "/v1/evals", content=json.dumps(bad, allow_nan=True),
                       headers={**AUTH, "Content-Type": "application/json"}, timeout=10)
        assert r.status_code in (400, 422), (bad, r.text)
    assert len(rkeys.client.xrange(Keys().eval_stream)) == 2
