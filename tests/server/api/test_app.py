"""The rollout server over real HTTP: uvicorn on a free port, the hf engine on the tiny model,
a real redis-server, and the official ``openai`` client.

What is checked end to end: the OpenAI shapes the client parses (logprobs, n, tools), the RL
extension fields, that every sample lands in Redis with the right tokens, mask, behavior
log-probabilities (equal to a plain forward pass of the model) and versions, and that the
rewards API closes the loop on ids the sampling routes returned.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import msgpack
import numpy as np
import openai
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers.queue import stored_rollout
from tests.helpers.reference_logprobs import sequence_logprobs
from tests.helpers.serving import (
    API_KEY,
    MODEL_NAME,
    RedisKeys,
    Served,
)

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
AUTH = {"Authorization": f"Bearer {API_KEY}"}





@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):  # -> PreTrainedTokenizerFast
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def stored(rkeys: RedisKeys, rollout_id: str):  # -> RolloutRecord
    rec = stored_rollout(rkeys.client, rollout_id, rkeys.keys)
    assert rec is not None, f"rollout {rollout_id} not in Redis"
    return rec


def test_health(served: Served) -> None:
    body = httpx.get(f"{served.url}/health", timeout=10).json()
    assert body["status"] == "ok" and body["redis"] == "ok"
    assert (body["engine"], body["model"], body["policy_version"]) == ("hf", MODEL_NAME, 0)


def test_chat_n_with_logprobs(client: openai.OpenAI, tokenizer) -> None:
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "add 2 and 3"}], n=3,
        max_tokens=12, temperature=1.0, logprobs=True, top_logprobs=3, seed=7)
    assert r.object == "chat.completion" and r.model == MODEL_NAME and len(r.choices) == 3
    assert [c.index for c in r.choices] == [0, 1, 2]
    ids = [c.model_extra["token_ids"] for c in r.choices]
    assert len({c.model_extra["rollout_id"] for c in r.choices}) == 3
    assert len({tuple(t) for t in ids}) > 1, "seed + i: the n samples must differ"
    assert r.usage.completion_tokens == sum(len(t) for t in ids)
    assert r.usage.prompt_tokens == len(r.choices[0].model_extra["prompt_token_ids"])
    for c, token_ids in zip(r.choices, ids, strict=True):
        content = c.logprobs.content
        assert len(content) == len(token_ids) == len(c.model_extra["policy_versions"])
        assert c.model_extra["policy_version"] == 0
        for entry in content:
            assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
            tops = [t.logprob for t in entry.top_logprobs]
            assert tops == sorted(tops, reverse=True) and tops[0] >= entry.logprob - 1e-5
        # Token bytes are exact (a token may hold part of a UTF-8 character).
        joined = b"".join(bytes(e.bytes) for e in content)
        assert joined.decode("utf-8", "replace") == tokenizer.decode(token_ids)
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "length":
            assert len(token_ids) == 12
            assert c.message.content == tokenizer.decode(token_ids)


def test_chat_prompt_is_the_chat_template(client: openai.OpenAI, tokenizer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=2)
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=True, return_dict=False)
    assert r.choices[0].model_extra["prompt_token_ids"] == list(expected)


def test_chat_rollouts_land_in_redis(client: openai.OpenAI, rkeys: RedisKeys,
                                     tiny_model_dir: Path) -> None:
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "count to five"}], n=2,
        max_tokens=10, temperature=0.7, logprobs=True, extra_body={"metadata": {"task": 42}})
    group_id = r.model_extra["group_id"]
    rids = [rkeys.client.lindex(rkeys.keys.group_rollouts(group_id), i) for i in range(2)]
    assert [x.decode() for x in rids] == [c.model_extra["rollout_id"] for c in r.choices]
    assert rkeys.client.hget(rkeys.keys.group(group_id), "size") == b"2"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for c in r.choices:
        rec = stored(rkeys, c.model_extra["rollout_id"])
        prompt, completion = c.model_extra["prompt_token_ids"], c.model_extra["token_ids"]
        p, n = len(prompt), len(completion)
        assert rec.group_id == group_id and rec.prompt_len == p
        assert rec.token_ids.tolist() == prompt + completion
        assert rec.loss_mask.tolist() == [0] * p + [1] * n
        assert rec.versions.tolist() == [-1] * p + [0] * n
        assert rec.turns == [(p, p + n)] and rec.temperature == pytest.approx(0.7)
        assert rec.finish_reason == c.finish_reason
        np.testing.assert_allclose(rec.logprobs[p:], [e.logprob for e in c.logprobs.content],
                                   rtol=0, atol=1e-6)
        assert not rec.logprobs[:p].any()
        # The behavior log-probabilities are the model's: a plain forward pass agrees.
        ref = sequence_logprobs(model, rec.token_ids.tolist(), p, 0.7)
        np.testing.assert_allclose(rec.logprobs[p:], ref, rtol=0, atol=2e-4)


def test_tools_are_rendered_into_the_prompt(client: openai.OpenAI, tokenizer) -> None:
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[WEATHER_TOOL], max_tokens=4)
    prompt = tokenizer.decode(r.choices[0].model_extra["prompt_token_ids"])
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    assert '"required": ["city"]' in prompt
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_call_history_is_rendered(client: openai.OpenAI, tokenizer) -> None:
    """An assistant turn with tool_calls (OpenAI wire form: arguments as a JSON string) and
    the tool's answer are rendered the way the model was taught, arguments not re-encoded."""
    messages = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages,
                                       tools=[WEATHER_TOOL], max_tokens=4)
    prompt = tokenizer.decode(r.choices[0].model_extra["prompt_token_ids"])
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>') in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_completions_with_token_id_prompt(client: openai.OpenAI, tokenizer,
                                          rkeys: RedisKeys) -> None:
    prompt = [5, 17, 230, 41, 9]
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, n=2, max_tokens=8,
                                  logprobs=2, seed=3, extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and len(r.choices) == 2
    for c in r.choices:
        ids = c.model_extra["token_ids"]
        assert c.model_extra["prompt_token_ids"] == prompt and len(ids) == 8
        assert c.finish_reason == "length" and c.text == tokenizer.decode(ids)
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 8
        assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0
        rec = stored(rkeys, c.model_extra["rollout_id"])
        assert rec.token_ids.tolist() == prompt + ids and rec.prompt_len == len(prompt)
        np.testing.assert_allclose(rec.logprobs[5:], lp.token_logprobs, atol=1e-6)


def test_completions_text_prompt_and_seed(client: openai.OpenAI, tokenizer) -> None:
    kw = dict(model=MODEL_NAME, prompt="the answer is", max_tokens=10, seed=11,
              extra_body={"ignore_eos": True})
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].model_extra["prompt_token_ids"] == tokenizer.encode("the answer is")
    assert a.choices[0].model_extra["token_ids"] == b.choices[0].model_extra["token_ids"]
    assert a.choices[0].model_extra["rollout_id"] != b.choices[0].model_extra["rollout_id"]


def test_stop_string_cuts_the_text(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL_NAME, prompt=[40, 41, 42], max_tokens=16, seed=5,
              extra_body={"ignore_eos": True})
    full = client.completions.create(**kw).choices[0]
    text = full.text
    cut = next((i for i in range(2, len(text)) if text[i].isalpha() and text[:i].strip()),
               None)
    if cut is None:
        pytest.skip(f"sampled text has no usable stop string: {text!r}")
    stop = text[cut]
    first = text.index(stop)
    stopped = client.completions.create(stop=[stop], **kw).choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == text[:first]
    ids = stopped.model_extra["token_ids"]
    assert ids == full.model_extra["token_ids"][:len(ids)]  # the tokens are kept as sampled


def test_native_rollouts(served: Served, rkeys: RedisKeys, tokenizer) -> None:
    body = {"messages": [{"role": "user", "content": "say hi"}], "n": 4, "max_tokens": 6,
            "top_logprobs": 2, "metadata": {"task_id": "t-1", "answer": 5}}
    r = httpx.post(f"{served.v1}/rollouts", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["rollouts"]) == 4 and out["model"] == MODEL_NAME
    expected = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True,
                                             tokenize=True, return_dict=False)
    assert out["prompt_token_ids"] == list(expected)
    group = rkeys.client.hgetall(rkeys.keys.group(out["group_id"]))
    assert group[b"size"] == b"4" and group[b"state"] == b"open"
    assert msgpack.unpackb(group[b"metadata"]) == body["metadata"]
    for ro in out["rollouts"]:
        assert len(ro["token_ids"]) == len(ro["logprobs"]) == len(ro["top_logprobs"])
        rec = stored(rkeys, ro["rollout_id"])
        assert rec.completion_token_ids.tolist() == ro["token_ids"]
        np.testing.assert_allclose(rec.logprobs[rec.prompt_len:], ro["logprobs"], atol=1e-6)


@pytest.mark.parametrize("prompt", [{"prompt": "hello"}, {"prompt_token_ids": [7, 8, 9]}])
def test_native_rollouts_prompt_forms(served: Served, prompt: dict, tokenizer) -> None:
    r = httpx.post(f"{served.v1}/rollouts", json={**prompt, "n": 2, "max_tokens": 3},
                   headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    expected = prompt.get("prompt_token_ids") or tokenizer.encode(prompt["prompt"])
    assert r.json()["prompt_token_ids"] == expected


def test_rewards_close_the_loop(served: Served) -> None:
    """Ids from /v1/rollouts are accepted by /v1/rewards; the group is published."""
    r = httpx.post(f"{served.v1}/rollouts", json={"prompt_token_ids": [3, 4], "n": 2,
                   "max_tokens": 3}, headers=AUTH, timeout=60).json()
    rewards = [{"rollout_id": ro["rollout_id"], "reward": float(i)}
               for i, ro in enumerate(r["rollouts"])]
    posted = httpx.post(f"{served.v1}/rewards", json=rewards, headers=AUTH, timeout=30)
    assert posted.status_code == 200, posted.text
    group = httpx.get(f"{served.v1}/groups/{r['group_id']}", headers=AUTH, timeout=30).json()
    assert group["state"] == "published" and group["n_rewarded"] == 2


def test_tool_choice_none(client: openai.OpenAI) -> None:
    """tool_choice "none": tools are accepted, nothing is parsed as a call. (The parser
    itself is tested in test_chat_tools: a random model rarely writes a valid call.)"""
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], tools=[WEATHER_TOOL],
        tool_choice="none", max_tokens=5)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length")


def test_metrics(served: Served, client: openai.OpenAI) -> None:
    client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user",
                                                                "content": "x"}], max_tokens=3)
    httpx.post(f"{served.v1}/chat/completions", json={}, timeout=10)  # 401: no key
    text = httpx.get(f"{served.url}/metrics", timeout=10).text
    assert ('gspo_http_requests_total{method="POST",route="/v1/chat/completions",'
            'status="200"}') in text
    assert ('gspo_http_requests_total{method="POST",route="/v1/chat/completions",'
            'status="401"}') in text
    assert 'gspo_http_request_seconds_count{route="/v1/chat/completions"}' in text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values['gspo_completion_tokens_total{route="chat"}'] >= 1
    assert values['gspo_prompt_tokens_total{route="chat"}'] >= 1
    assert values["gspo_policy_version"] == 0
    assert values["gspo_engine_running"] == 0 and values["gspo_engine_waiting"] == 0
    assert values["gspo_rollouts_recorded_total"] >= 1


def test_openapi_lists_the_routes(served: Served) -> None:
    paths = httpx.get(f"{served.url}/openapi.json", timeout=10).json()["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/rollouts", "/v1/rewards",
                 "/health", "/metrics"):
        assert path in paths
    assert json.dumps(paths["/v1/rollouts"]["post"]["requestBody"])  # a pydantic body
