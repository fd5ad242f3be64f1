"""Multi-turn episodes over real HTTP: uvicorn on a free port, the hf engine on the tiny model, a
real redis-server, the official ``openai`` client.

What is checked: the stored trajectory is, turn by turn, exactly the tokens the engine was given
and sampled (and a forward pass over it reproduces every behavior log-probability); the loss
mask is 1 exactly on sampled tokens; a sampled turn that re-tokenises differently stays as
sampled; a real tool call round trip (a tiny model taught one tool-use conversation); the
prefix-mismatch policies; every bad input is a clear 4xx that changes nothing.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import redis
from transformers import AutoModelForCausalLM, AutoTokenizer

from gspo_rl.client.examples.calculator import (
    CALCULATOR_TOOL,
    SYSTEM,
    assistant_message,
    run_tool_call,
)
from gspo_rl.contract.schema import Keys, RolloutRecord, unpack_rollout
from tests.conftest import RedisServer
from tests.helpers.queue import ready_groups
from tests.helpers.reference_logprobs import sequence_logprobs
from tests.helpers.serving import API_KEY, MODEL_NAME, Served, running_server
from tests.helpers.template_models import teach_conversation

AUTH = {"Authorization": f"Bearer {API_KEY}"}
KEYS = Keys()
MAX_TURNS = 3


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, redis_mod: RedisServer) -> Iterator[Served]:
    with running_server(tiny_model_dir, redis_mod.url, max_episode_turns=MAX_TURNS) as s:
        yield s



@pytest.fixture(scope="module")
def r(redis_mod: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_mod.url, socket_timeout=10)
    yield c
    c.close()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):  # -> PreTrainedTokenizerFast
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def open_group(served: Served, size: int, metadata: dict[str, Any] | None = None) -> dict:
    resp = httpx.post(f"{served.url}/v1/groups", json={"size": size, "metadata": metadata},
                      headers=AUTH, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def turn(client: openai.OpenAI, rid: str, messages: list[dict], **kw: Any) -> Any:
    kw.setdefault("max_tokens", 8)
    return client.chat.completions.create(model=MODEL_NAME, messages=messages,
                                          extra_body={"rollout_id": rid}, **kw).choices[0]


def record(r: redis.Redis, rid: str) -> RolloutRecord:
    raw = r.get(KEYS.rollout(rid))
    assert raw is not None
    return unpack_rollout(raw)


def episode_keys(r: redis.Redis, rid: str) -> tuple[bytes | None, dict]:
    return r.get(KEYS.rollout(rid)), r.hgetall(KEYS.episode(rid))


def reward(served: Served, body: Any) -> httpx.Response:
    return httpx.post(f"{served.url}/v1/rewards", json=body, headers=AUTH, timeout=30)


def expect_error(fn: Any, status: int, code: str) -> str:
    with pytest.raises(openai.APIStatusError) as exc:
        fn()
    assert exc.value.status_code == status, exc.value.body
    assert exc.value.body["code"] == code, exc.value.body
    return exc.value.body["message"]


def test_open_group_records_empty_episodes(served: Served, r: redis.Redis) -> None:
    g = open_group(served, 3, {"task": "t1"})
    assert len(g["rollout_ids"]) == len(set(g["rollout_ids"])) == 3
    assert g["policy_version"] == 0  # the version its episodes start at
    view = httpx.get(f"{served.url}/v1/groups/{g['group_id']}", headers=AUTH).json()
    assert (view["state"], view["size"], view["n_rollouts"]) == ("open", 3, 3)
    assert view["metadata"] == {"task": "t1"}
    for rid in g["rollout_ids"]:
        rec = record(r, rid)
        assert rec.group_id == g["group_id"] and len(rec.token_ids) == 0 and rec.turns == []
        assert r.hget(KEYS.episode(rid), "n_turns") == b"0"
    before = sorted(r.keys("gspo:*"))
    for body in ({"size": 0}, {"size": 10**6}, {"size": 2, "extra": 1}, {"metadata": {}}):
        resp = httpx.post(f"{served.url}/v1/groups", json=body, headers=AUTH, timeout=30)
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"]["message"]
    assert sorted(r.keys("gspo:*")) == before


def test_trajectory_is_what_the_engine_saw_and_wrote(
    served: Served, client: openai.OpenAI, r: redis.Redis, tokenizer, tiny_model_dir: Path
) -> None:
    rid = open_group(served, 1)["rollout_ids"][0]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    trajectory: list[int] = []
    spans, sampled_lp, last_finish = [], [], ""
    for k in range(MAX_TURNS):
        c = turn(client, rid, messages, temperature=0.8, logprobs=True, seed=k)
        prompt, sampled = c.model_extra["prompt_token_ids"], c.model_extra["token_ids"]
        if k == 0:  # the first turn is the plain chat template, as a single-turn call
            assert prompt == tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        else:  # earlier tokens are never re-tokenised: the last trajectory is a prefix
            assert prompt[:len(trajectory)] == trajectory
            new_text = tokenizer.decode(prompt[len(trajectory):])
            closing = "" if last_finish == "stop" else "<|im_end|>"
            assert new_text == (f"{closing}\n<|im_start|>user\n{messages[-1]['content']}"
                                "<|im_end|>\n<|im_start|>assistant\n")
        rec = record(r, rid)
        assert rec.token_ids.tolist() == prompt + sampled
        spans.append((len(prompt), len(prompt) + len(sampled)))
        sampled_lp += [e.logprob for e in c.logprobs.content]
        assert rec.turns == spans and rec.prompt_len == spans[0][0]
        mask = np.zeros(len(rec.token_ids), np.uint8)
        for a, b in spans:
            mask[a:b] = 1
        assert rec.loss_mask.tolist() == mask.tolist()
        assert rec.versions.tolist() == np.where(mask == 1, 0, -1).tolist()
        np.testing.assert_allclose(rec.logprobs[mask == 1], sampled_lp, rtol=0, atol=1e-6)
        assert not rec.logprobs[mask == 0].any()
        assert rec.temperature == pytest.approx(0.8) and rec.finish_reason == c.finish_reason
        trajectory, last_finish = rec.token_ids.tolist(), c.finish_reason
        messages = [*messages, {"role": "assistant", "content": c.message.content},
                    {"role": "user", "content": f"and then {k}?"}]
    # The engine's context at every turn was the stored prefix: one forward pass over the
    # final trajectory reproduces every turn's behavior log-probabilities.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for a, b in spans:
        ref = sequence_logprobs(model, trajectory[:b], a, 0.8)
        np.testing.assert_allclose(record(r, rid).logprobs[a:b], ref, rtol=0, atol=2e-4)


def test_sampled_ids_stay_even_where_retokenising_differs(
    served: Served, client: openai.OpenAI, r: redis.Redis, tokenizer
) -> None:
    g = open_group(served, 8)
    messages = [{"role": "user", "content": "say something"}]
    for seed, rid in enumerate(g["rollout_ids"]):
        c = turn(client, rid, messages, max_tokens=12, seed=seed)
        sampled = c.model_extra["token_ids"]
        history = [*messages, {"role": "assistant", "content": c.message.content},
                   {"role": "user", "content": "more"}]
        rerendered = tokenizer.apply_chat_template(history, add_generation_prompt=True,
                                                   tokenize=True, return_dict=False)
        start = len(c.model_extra["prompt_token_ids"])
        if rerendered[start:start + len(sampled)] != sampled:
            break
    else:
        pytest.fail("no sampled turn re-tokenised differently in 8 tries")
    c2 = turn(client, rid, history, seed=99)
    prompt2 = c2.model_extra["prompt_token_ids"]
    assert prompt2[start:start + len(sampled)] == sampled  # as sampled, not re-tokenised
    assert prompt2 != rerendered
    rec = record(r, rid)
    assert rec.token_ids[start:start + len(sampled)].tolist() == sampled
    assert rec.loss_mask[start:start + len(sampled)].all()


def test_bad_turns_are_refused_and_change_nothing(
    served: Served, client: openai.OpenAI, r: redis.Redis
) -> None:
    g = open_group(served, 2)
    rid, other = g["rollout_ids"]
    expect_error(lambda: turn(client, "nope", [{"role": "user", "content": "x"}]), 404,
                 "unknown_episode")
    single = client.chat.completions.create(  # recorded: a one-sample group, no episode
        model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], max_tokens=2,
        extra_body={"record": True})
    expect_error(lambda: turn(client, single.choices[0].model_extra["rollout_id"],
                              [{"role": "user", "content": "x"}]), 409, "not_an_episode")
    expect_error(lambda: turn(client, rid, [{"role": "user", "content": "x"}], n=2), 400,
                 "invalid_n")
    # A reward before any model turn: refused, the episode stays open.
    resp = reward(served, {"rollout_id": rid, "reward": 1.0})
    assert (resp.status_code, resp.json()["error"]["code"]) == (409, "episode_empty")

    first = [{"role": "user", "content": "hello"}]
    c = turn(client, rid, first, temperature=1.0)
    said = {"role": "assistant", "content": c.message.content}
    good = [*first, said, {"role": "user", "content": "go on"}]
    snapshot = episode_keys(r, rid)
    bad: list[tuple[dict[str, Any], int, str]] = [
        ({"messages": [{"role": "user", "content": "HELLO"}, said, good[2]]}, 409,
         "history_mismatch"),
        ({"messages": [*first, {"role": "assistant", "content": "not what you said"},
                       good[2]]}, 409, "history_mismatch"),
        ({"messages": [good[2]]}, 409, "history_mismatch"),
        ({"messages": [*first, said]}, 400, "no_new_messages"),
        ({"messages": good, "tools": [CALCULATOR_TOOL]}, 409, "tools_changed"),
        ({"messages": good, "temperature": 0.5}, 409, "temperature_changed"),
        ({"messages": good, "top_p": 0.9}, 409, "sampling_changed"),
        ({"messages": good, "max_tokens": 10**6}, 400, "max_tokens_too_large"),
        ({"messages": [*good[:2], {"role": "user", "content": "word " * 3000}]}, 400,
         "context_length_exceeded"),
    ]
    for kw, status, code in bad:
        msgs = kw.pop("messages")
        message = expect_error(lambda m=msgs, k=kw: turn(client, rid, m, **k), status, code)
        assert len(message) > 20
        assert episode_keys(r, rid) == snapshot, code
    # Turns up to the limit, then a clear 400.
    history = good
    for _ in range(MAX_TURNS - 1):
        c = turn(client, rid, history)
        history = [*history, {"role": "assistant", "content": c.message.content},
                   {"role": "user", "content": "again"}]
    assert int(r.hget(KEYS.episode(rid), "n_turns")) == MAX_TURNS
    expect_error(lambda: turn(client, rid, history), 400, "episode_turn_limit")

    # Rewards: turn_rewards must have one entry per model turn.
    snapshot = episode_keys(r, rid)
    resp = reward(served, {"rollout_id": rid, "reward": 1.0, "turn_rewards": [0.5]})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "turn_count_mismatch"
    assert f"1 turn_rewards for an episode with {MAX_TURNS} model turn" in resp.text
    assert episode_keys(r, rid) == snapshot
    assert not r.hexists(KEYS.group_rewards(g["group_id"]), rid)
    ok = reward(served, {"rollout_id": rid, "reward": 1.0, "turn_rewards": [0.5, 0, 0]})
    assert ok.status_code == 200 and ok.json()["results"][0]["status"] == "stored"
    expect_error(lambda: turn(client, rid, history), 409, "episode_finished")

    # The other episode finishes the group: published with both trajectories.
    c = turn(client, other, first)
    assert reward(served, {"rollout_id": other, "reward": 0.0}).status_code == 200
    group = ready_groups(r, KEYS)[-1]
    assert group.group_id == g["group_id"] and group.rewards == [1.0, 0.0]
    assert group.turn_rewards == [[0.5, 0.0, 0.0], None]
    assert [len(x.turns) for x in group.rollouts] == [MAX_TURNS, 1]
    assert group.rollouts[1].token_ids.tolist() == (c.model_extra["prompt_token_ids"]
                                                    + c.model_extra["token_ids"])


def test_malformed_turn_rewards_and_temperature_zero_are_refused(
    served: Served, client: openai.OpenAI, r: redis.Redis
) -> None:
    # A single-turn rollout has one model turn: two turn rewards used to get a 200, and the
    # learner then dropped the whole group.
    single = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], max_tokens=2,
        n=2, seed=1)
    rids = [c.model_extra["rollout_id"] for c in single.choices]
    gid = single.model_extra["group_id"]
    for bad in ([0.5, 0.5], [0.0, 0.0, 1.0]):
        resp = reward(served, [{"rollout_id": rids[0], "reward": 1.0, "turn_rewards": bad},
                               {"rollout_id": rids[1], "reward": 0.0}])
        assert resp.status_code == 409, resp.text  # the rollout's stored turns decide
        err = resp.json()["error"]
        assert err["code"] == "turn_count_mismatch" and "at most one" in err["message"]
        assert not r.exists(KEYS.group_rewards(gid))  # nothing of the call was stored
    ok = reward(served, [{"rollout_id": rids[0], "reward": 1.0, "turn_rewards": [0.5]},
                         {"rollout_id": rids[1], "reward": 1.0, "turn_rewards": [0.0]}])
    assert ok.status_code == 200, ok.text
    # Equal final rewards, different turn rewards: published, not dropped as zero variance.
    assert r.hget(KEYS.group(gid), "state") == b"published"
    # Temperature 0 on an episode's turn: refused before anything is sampled or recorded.
    rid = open_group(served, 1)["rollout_ids"][0]
    snapshot = episode_keys(r, rid)
    expect_error(lambda: turn(client, rid, [{"role": "user", "content": "hi"}],
                              temperature=0), 400, "temperature_zero")
    assert episode_keys(r, rid) == snapshot


def test_concurrent_turns_of_one_episode_one_wins(
    served: Served, client: openai.OpenAI, r: redis.Redis
) -> None:
    rid = open_group(served, 1)["rollout_ids"][0]
    first = [{"role": "user", "content": "hello"}]
    c = turn(client, rid, first)
    said = {"role": "assistant", "content": c.message.content}
    aclient = openai.AsyncOpenAI(base_url=client.base_url, api_key=API_KEY, max_retries=0,
                                 timeout=60)

    async def both() -> list[Any]:
        calls = [aclient.chat.completions.create(
            model=MODEL_NAME, messages=[*first, said, {"role": "user", "content": text}],
            max_tokens=8, extra_body={"rollout_id": rid}) for text in ("left", "right")]
        try:
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await aclient.close()

    results = asyncio.run(both())
    won = [x for x in results if not isinstance(x, Exception)]
    lost = [x for x in results if isinstance(x, Exception)]
    assert len(won) == 1 and len(lost) == 1, results
    assert isinstance(lost[0], openai.APIStatusError) and lost[0].status_code == 409
    assert lost[0].body["code"] in ("concurrent_turn", "history_mismatch")
    rec = record(r, rid)
    ch = won[0].choices[0]
    assert len(rec.turns) == 2
    assert rec.token_ids.tolist() == ch.model_extra["prompt_token_ids"] + ch.model_extra[
        "token_ids"]


# ---------------------------------------------------------------------------- real tool calls
TOOL_CONVERSATION = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_0", "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "5"},
    {"role": "assistant", "content": "The answer is 5."},
]


def _teach_tool_use(src: Path, dst: Path) -> Path:
    """A copy of the tiny model trained (supervised, on its assistant tokens only) until it
    reproduces ``TOOL_CONVERSATION``: a model that really calls the calculator."""
    shutil.copytree(src, dst)
    teach_conversation(dst, TOOL_CONVERSATION, [CALCULATOR_TOOL], steps=400, max_loss=1e-3)
    return dst


def test_tool_use_episode_through_the_openai_client(
    tiny_model_dir: Path, redis_mod: RedisServer, tmp_path: Path, r: redis.Redis
) -> None:
    model_dir = _teach_tool_use(tiny_model_dir, tmp_path / "tool-model")
    tok = AutoTokenizer.from_pretrained(model_dir)
    with running_server(model_dir, redis_mod.url) as s:
        client = openai.OpenAI(base_url=s.v1, api_key=API_KEY, max_retries=0, timeout=60)
        g = open_group(s, 2, {"task": "2 + 3"})
        rid = g["rollout_ids"][0]
        messages: list[dict[str, Any]] = TOOL_CONVERSATION[:2]
        c1 = turn(client, rid, messages, tools=[CALCULATOR_TOOL], max_tokens=40,
                  temperature=0.5, seed=1)
        assert c1.finish_reason == "tool_calls", c1.message
        (call,) = c1.message.tool_calls
        assert call.function.name == "calculator"
        tool_msg, ok = run_tool_call(call)
        assert ok and tool_msg["content"] == "5"
        messages = [*messages, assistant_message(c1.message), tool_msg]
        c2 = turn(client, rid, messages, tools=[CALCULATOR_TOOL], max_tokens=40,
                  temperature=0.5, seed=2)
        assert c2.message.content == "The answer is 5." and not c2.message.tool_calls

        rec = record(r, rid)
        p1, s1 = c1.model_extra["prompt_token_ids"], c1.model_extra["token_ids"]
        p2, s2 = c2.model_extra["prompt_token_ids"], c2.model_extra["token_ids"]
        assert rec.token_ids.tolist() == p2 + s2 and p2[:len(p1) + len(s1)] == p1 + s1
        assert rec.turns == [(len(p1), len(p1) + len(s1)), (len(p2), len(p2) + len(s2))]
        # Between the turns: only the tool's result, rendered by the template (mask 0).
        assert tok.decode(p2[len(p1) + len(s1):]) == (
            "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n")
        assert rec.loss_mask.sum() == len(s1) + len(s2)
        assert tok.decode(s1).startswith('<tool_call>\n{"name": "calculator"')
        resp = reward(s, {"rollout_id": rid, "reward": 1.0, "turn_rewards": [0.1, 0.0]})
        assert resp.status_code == 200, resp.text
        view = httpx.get(f"{s.url}/v1/groups/{g['group_id']}", headers=AUTH).json()
        assert view["rollouts"][0]["turn_rewards"] == [0.1, 0.0]


# ---------------------------------------------------------------------------- rewritten history
# A Qwen3-like template: reasoning of assistant turns before the last user message is dropped.
REWRITING_TEMPLATE = """\
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}\
{%- endif %}{%- endfor %}
{%- for m in messages %}
{%- set content = m.content or '' %}
{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}
{%- set content = content.split('</think>')[-1] %}
{%- endif %}
{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


@pytest.fixture(scope="module")
def rewriting_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("rewriting") / "model"
    shutil.copytree(tiny_model_dir, dst)
    tok = AutoTokenizer.from_pretrained(dst)
    tok.chat_template = REWRITING_TEMPLATE
    tok.save_pretrained(dst)
    return dst


@pytest.mark.parametrize("policy", ["append", "reject"])
def test_rewritten_history_policies(rewriting_model_dir: Path, redis_mod: RedisServer,
                                    r: redis.Redis, policy: str) -> None:
    first = [{"role": "user", "content": "plan"},
             {"role": "assistant", "content": "<think>secret plan</think>ok"},
             {"role": "tool", "content": "done"}]
    with running_server(rewriting_model_dir, redis_mod.url,
                        episode_history_rewrite=policy) as s:
        client = openai.OpenAI(base_url=s.v1, api_key=API_KEY, max_retries=0, timeout=60)
        rid = open_group(s, 1)["rollout_ids"][0]
        c1 = turn(client, rid, first)
        tok = AutoTokenizer.from_pretrained(rewriting_model_dir)
        assert "secret plan" in tok.decode(c1.model_extra["prompt_token_ids"])
        history = [*first, {"role": "assistant", "content": c1.message.content},
                   {"role": "user", "content": "next"}]
        rerendered = tok.decode(tok.apply_chat_template(history, add_generation_prompt=True,
                                                        tokenize=True, return_dict=False))
        assert "secret plan" not in rerendered  # the template rewrites the history
        if policy == "reject":
            before = episode_keys(r, rid)
            expect_error(lambda: turn(client, rid, history), 409, "history_rewritten")
            assert episode_keys(r, rid) == before
            return
        c2 = turn(client, rid, history)
        p1, s1 = c1.model_extra["prompt_token_ids"], c1.model_extra["token_ids"]
        p2 = c2.model_extra["prompt_token_ids"]
        assert p2[:len(p1) + len(s1)] == p1 + s1  # what the model saw and wrote, kept
        closing = "" if c1.finish_reason == "stop" else "<|im_end|>"
        assert tok.decode(p2[len(p1) + len(s1):]) == (
            f"{closing}\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n")
        rec = record(r, rid)
        assert rec.metadata["history_rewrites"] == 1 and len(rec.turns) == 2
