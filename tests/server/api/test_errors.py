"""Bad input to the rollout server: a 4xx JSON error that says what is wrong, nothing
recorded in Redis, and the server still serving afterwards. Real uvicorn, real Redis."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.helpers.serving import (
    ADMIN_KEY,
    API_KEY,
    MODEL_NAME,
    RedisKeys,
    Served,
)

AUTH = {"Authorization": f"Bearer {API_KEY}"}
USER = [{"role": "user", "content": "hi"}]
CONTEXT = 2048  # the tiny model's max_position_embeddings
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ROLLOUTS = "/v1/rollouts"




def chat(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": USER, "max_tokens": 4, **kw}


def comp(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "prompt": [1, 2, 3], "max_tokens": 4, **kw}


# (path, json body, expected status, words the message must contain)
CASES: list[tuple[str, Any, int, list[str]]] = [
    (CHAT, {"messages": USER}, 422, ["model", "Field required"]),
    (CHAT, {"model": MODEL_NAME}, 422, ["messages", "Field required"]),
    (CHAT, chat(messages=[]), 422, ["messages", "at least 1"]),
    (CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 422, ["role"]),
    (CHAT, chat(model="gpt-4o"), 404, ["gpt-4o", MODEL_NAME]),
    (CHAT, chat(n=9), 400, ["n 9", "limit of 8"]),
    (CHAT, chat(n=0), 422, ["n"]),
    (CHAT, chat(max_tokens=65), 400, ["max_tokens 65", "limit of 64"]),
    (CHAT, chat(max_tokens=None, max_completion_tokens=100), 400, ["100", "64"]),
    (CHAT, chat(max_tokens=0), 422, ["max_tokens"]),
    (CHAT, chat(temperature=2.5), 422, ["temperature"]),
    (CHAT, chat(temperature=0, record=True), 400, ["temperature 0", "greedy", ">= 0.001"]),
    (CHAT, chat(temperature=1e-6, n=2), 400, ["temperature 1e-06", "greedy"]),
    (COMPLETIONS, comp(temperature=0.0), 400, ["temperature 0", "greedy"]),
    (ROLLOUTS, {"prompt": "a", "temperature": 0}, 400, ["temperature 0", "greedy"]),
    (CHAT, chat(top_p=0), 422, ["top_p"]),
    (CHAT, chat(stream=True, stream_options={"include_usage": 1}), 400, ["include_usage"]),
    (CHAT, chat(presence_penalty=0.5), 400, ["presence_penalty"]),
    (CHAT, chat(logit_bias={"5": 1.0}), 400, ["logit_bias"]),
    (CHAT, chat(logprobs=True, top_logprobs=21), 400, ["top_logprobs 21", "20"]),
    (CHAT, chat(top_logprobs=2), 400, ["logprobs=true"]),
    (CHAT, chat(tool_choice="required", tools=[{"type": "function", "function": {
        "name": "f"}}]), 400, ["tool_choice"]),
    (CHAT, chat(response_format={"type": "json_object"}), 400, ["response_format"]),
    (CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]), 400, ["image_url"]),
    (CHAT, chat(stop=[""]), 400, ["stop"]),
    (CHAT, chat(messages=[{"role": "user", "content": "x " * 3000}]), 400,
     ["context", str(CONTEXT)]),
    (COMPLETIONS, comp(prompt=[i % 900 for i in range(2000)], max_tokens=64), 400,
     ["2000", "64", "2064", str(CONTEXT)]),
    (COMPLETIONS, comp(prompt=[1] * CONTEXT), 400, [str(CONTEXT), "no room"]),
    (COMPLETIONS, comp(prompt=[]), 400, ["empty"]),
    (COMPLETIONS, comp(prompt=""), 400, ["empty"]),
    (COMPLETIONS, comp(prompt=[1, 99999]), 400, ["99999", "vocabulary"]),
    (COMPLETIONS, comp(prompt=[-1]), 400, ["-1", "vocabulary"]),
    (COMPLETIONS, comp(prompt=["a", "b"]), 400, ["one prompt"]),
    (COMPLETIONS, comp(echo=True), 400, ["echo"]),
    (COMPLETIONS, comp(logprobs=30), 400, ["30"]),
    (COMPLETIONS, comp(prompt={"x": 1}), 422, ["prompt"]),
    (ROLLOUTS, {"n": 2}, 400, ["exactly one", "none"]),
    (ROLLOUTS, {"prompt": "a", "prompt_token_ids": [1], "n": 2}, 400,
     ["exactly one", "prompt, prompt_token_ids"]),
    (ROLLOUTS, {"prompt": "a", "tools": [{"type": "function", "function": {"name": "f"}}]},
     400, ["tools need messages"]),
    (ROLLOUTS, {"prompt": "a", "temprature": 0.5}, 422, ["temprature", "not permitted"]),
    (ROLLOUTS, {"prompt": "a", "model": "other"}, 404, ["other", MODEL_NAME]),
    (ROLLOUTS, {"prompt_token_ids": [1], "n": 100}, 400, ["n 100"]),
    (ROLLOUTS, {"messages": [], "n": 2}, 400, ["messages is empty"]),
    (ROLLOUTS, {"prompt": "a", "metadata": "not a dict"}, 422, ["metadata"]),
]


def assert_error(r: httpx.Response, status: int, words: list[str]) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"} and err["type"]
    for word in words:
        assert word in err["message"], (word, err["message"])


@pytest.mark.parametrize(("path", "body", "status", "words"), CASES,
                         ids=[f"{i}-{c[0].rsplit('/', 1)[-1]}-{c[2]}" for i, c in
                              enumerate(CASES)])
def test_bad_input(served: Served, rkeys: RedisKeys, path: str, body: Any, status: int,
                   words: list[str]) -> None:
    before = rkeys.snapshot()
    r = httpx.post(served.url + path, json=body, headers=AUTH, timeout=30)
    assert_error(r, status, words)
    assert rkeys.snapshot() == before, "a refused request must record nothing"


@pytest.mark.parametrize("raw", [b'{"model": "tiny", "messages": [', b"not json", b"[1, 2"])
def test_malformed_json(served: Served, rkeys: RedisKeys, raw: bytes) -> None:
    before = rkeys.snapshot()
    r = httpx.post(served.url + CHAT, content=raw, timeout=30,
                   headers={**AUTH, "content-type": "application/json"})
    assert_error(r, 400, ["malformed JSON"])
    assert rkeys.snapshot() == before


def test_oversized_body(served: Served, rkeys: RedisKeys) -> None:
    before = rkeys.snapshot()
    big = chat(messages=[{"role": "user", "content": "x" * 70_000}])
    assert_error(httpx.post(served.url + CHAT, json=big, headers=AUTH, timeout=30), 413,
                 ["larger than"])
    assert rkeys.snapshot() == before


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, ROLLOUTS, "/v1/rewards"])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": f"Bearer {ADMIN_KEY}"},
                                     {"Authorization": API_KEY}])
def test_api_key_required(served: Served, rkeys: RedisKeys, path: str,
                          headers: dict[str, str]) -> None:
    before = rkeys.snapshot()
    r = httpx.post(served.url + path, json=comp(messages=USER), headers=headers, timeout=30)
    assert_error(r, 401, ["API key"])
    assert r.headers["www-authenticate"] == "Bearer"
    assert rkeys.snapshot() == before


def test_admin_routes_need_the_admin_key(served: Served) -> None:
    for headers in ({}, AUTH):
        r = httpx.post(f"{served.url}/admin/pause", headers=headers, timeout=30)
        assert_error(r, 401, ["admin key"])
    ok = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert httpx.post(f"{served.url}/admin/pause", headers=ok, timeout=30).status_code == 200
    assert httpx.post(f"{served.url}/admin/resume", headers=ok, timeout=30).status_code == 200


def test_openai_client_sees_typed_errors(served: Served) -> None:
    client = openai.OpenAI(base_url=served.v1, api_key=API_KEY, max_retries=0, timeout=30)
    with pytest.raises(openai.NotFoundError, match=MODEL_NAME):
        client.chat.completions.create(model="nope", messages=USER)
    with pytest.raises(openai.BadRequestError, match="limit of 8"):
        client.chat.completions.create(model=MODEL_NAME, messages=USER, n=20)
    with pytest.raises(openai.BadRequestError, match="include_usage"):
        client.chat.completions.create(model=MODEL_NAME, messages=USER, stream=True,
                                       stream_options={"include_usage": 1})  # type: ignore
    bad = openai.OpenAI(base_url=served.v1, api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=MODEL_NAME, prompt="x")


def test_still_serving_after_bad_input(served: Served) -> None:
    r = httpx.post(served.url + CHAT, json=chat(n=2), headers=AUTH, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"]) == 2
    assert httpx.get(f"{served.url}/health", timeout=10).json()["status"] == "ok"


def test_unknown_route_is_a_json_404(served: Served) -> None:
    assert_error(httpx.get(f"{served.url}/v1/nothing", headers=AUTH, timeout=10), 404,
                 ["/v1/nothing"])
