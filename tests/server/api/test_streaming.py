"""``stream: true`` over real HTTP: uvicorn on a free port, the hf engine on the tiny model, a
real redis-server, and the official ``openai`` client's streaming API.

Checked: the chunks are OpenAI's (``chat.completion.chunk`` / ``text_completion``, deltas, a
final chunk with ``finish_reason``, ``[DONE]``), the concatenated deltas (and log-probabilities)
are the non-streamed ones for the same seed, the usage chunk comes when asked, the RL extension
fields ride on each choice's final chunk, a streamed completion is recorded in Redis exactly as
a non-streamed one (same tokens, mask, behavior log-probabilities, versions); and that it is
incremental: text arrives while the completion is still being generated (a chunk's
log-probabilities show how many tokens existed when it was sent), n choices interleave, a
client that leaves mid-stream cancels the decoding, and a failure after the first byte (Redis
refusing the record, the engine stopping) reaches the client as an error event, not as a
stream that looks done.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from gspo_rl.contract.schema import Keys, RolloutRecord
from tests.conftest import RedisServer
from tests.helpers.queue import stored_rollout
from tests.helpers.serving import API_KEY, MODEL_NAME, RedisKeys, Served, running_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
USER = [{"role": "user", "content": "count to five"}]
SAMPLING: dict[str, Any] = dict(n=2, max_tokens=10, temperature=0.9, seed=11)
MAX_TOKENS = 1900  # long completions (context 2048): a client can leave during one


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, redis_mod: RedisServer) -> Iterator[Served]:
    with running_server(tiny_model_dir, redis_mod.url, max_tokens=MAX_TOKENS) as s:
        yield s


def stored(rkeys: RedisKeys, rollout_id: str) -> RolloutRecord:
    rec = stored_rollout(rkeys.client, rollout_id, rkeys.keys)
    assert rec is not None, f"rollout {rollout_id} not in Redis"
    return rec


def assert_same_record(a: RolloutRecord, b: RolloutRecord) -> None:
    """Two records of the same sample (same seed): equal but for their ids and times."""
    assert a.rollout_id != b.rollout_id and a.group_id != b.group_id
    assert a.token_ids.tolist() == b.token_ids.tolist()
    assert a.loss_mask.tolist() == b.loss_mask.tolist()
    assert a.versions.tolist() == b.versions.tolist()
    np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-5)
    assert (a.prompt_len, a.turns, a.finish_reason) == (b.prompt_len, b.turns, b.finish_reason)
    assert (a.temperature, a.top_p, a.top_k) == (b.temperature, b.top_p, b.top_k)
    assert a.metadata == b.metadata


def by_choice(chunks: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for chunk in chunks:
        for c in chunk.choices:
            out.setdefault(c.index, []).append(c)
    return out


def test_chat_stream_equals_non_streamed(client: openai.OpenAI, rkeys: RedisKeys) -> None:
    plain = client.chat.completions.create(model=MODEL_NAME, messages=USER, logprobs=True,
                                           top_logprobs=2, **SAMPLING)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=USER,
                                                 logprobs=True, top_logprobs=2, stream=True,
                                                 **SAMPLING))
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1 and chunks[0].id != plain.id
    assert all(c.usage is None for c in chunks), "no usage chunk unless asked"
    group_id = chunks[0].model_extra["group_id"]
    choices = by_choice(chunks)
    assert sorted(choices) == [0, 1]
    for i, want in enumerate(plain.choices):
        parts = choices[i]
        assert parts[0].delta.role == "assistant"
        assert "".join(p.delta.content or "" for p in parts) == want.message.content
        assert [p.finish_reason for p in parts[:-1]] == [None] * (len(parts) - 1)
        final = parts[-1]
        assert final.finish_reason == want.finish_reason
        joined = [e.logprob for p in parts if p.logprobs for e in p.logprobs.content]
        assert joined == pytest.approx([e.logprob for e in want.logprobs.content], abs=1e-5)
        ext, want_ext = final.model_extra, want.model_extra
        for key in ("token_ids", "prompt_token_ids", "policy_version", "policy_versions"):
            assert ext[key] == want_ext[key], key
        assert ext["rollout_id"] != want_ext["rollout_id"]
        # Recorded exactly as the non-streamed sample, in its own group.
        rec = stored(rkeys, ext["rollout_id"])
        assert rec.group_id == group_id
        assert_same_record(rec, stored(rkeys, want_ext["rollout_id"]))
    rids = rkeys.client.lrange(rkeys.keys.group_rollouts(group_id), 0, -1)
    assert [x.decode() for x in rids] == [choices[i][-1].model_extra["rollout_id"]
                                          for i in (0, 1)]


def test_completions_stream_equals_non_streamed(client: openai.OpenAI,
                                                rkeys: RedisKeys) -> None:
    kw: dict[str, Any] = dict(model=MODEL_NAME, prompt="Once upon a time", logprobs=2,
                              extra_body={"metadata": {"task": 7}}, **SAMPLING)
    plain = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, **kw))
    assert chunks and all(c.object == "text_completion" for c in chunks)
    choices = by_choice(chunks)
    assert sorted(choices) == [0, 1]
    for i, want in enumerate(plain.choices):
        parts = choices[i]
        assert "".join(p.text for p in parts) == want.text
        final = parts[-1]
        assert final.finish_reason == want.finish_reason
        for key in ("tokens", "text_offset", "token_logprobs"):
            joined = [x for p in parts if p.logprobs for x in getattr(p.logprobs, key)]
            assert joined == pytest.approx(getattr(want.logprobs, key), abs=1e-5), key
        ext, want_ext = final.model_extra, want.model_extra
        for key in ("token_ids", "prompt_token_ids", "policy_version", "policy_versions"):
            assert ext[key] == want_ext[key], key
        assert_same_record(stored(rkeys, ext["rollout_id"]),
                           stored(rkeys, want_ext["rollout_id"]))


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_usage_chunk_when_asked(client: openai.OpenAI, route: str) -> None:
    kw: dict[str, Any] = dict(model=MODEL_NAME, stream=True, n=2, max_tokens=6,
                              stream_options={"include_usage": True})
    if route == "chat":
        chunks = list(client.chat.completions.create(messages=USER, **kw))
    else:
        chunks = list(client.completions.create(prompt="hello", **kw))
    *body, last = chunks
    assert last.choices == [] and last.usage is not None
    assert all(c.usage is None for c in body) and all(c.choices for c in body)
    finals = [c for ch in body for c in ch.choices if c.finish_reason is not None]
    completion_tokens = sum(len(c.model_extra["token_ids"]) for c in finals)
    prompt_tokens = len(finals[0].model_extra["prompt_token_ids"])
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (prompt_tokens,
                                                                        completion_tokens)
    assert last.usage.total_tokens == prompt_tokens + completion_tokens


def test_wire_format_is_sse_ending_with_done(served: Served) -> None:
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{served.v1}/chat/completions", json=body, headers=AUTH,
                      timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        text = resp.read().decode()
    events = text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_errors_before_streaming_stay_json(served: Served, client: openai.OpenAI,
                                           rkeys: RedisKeys) -> None:
    before = rkeys.snapshot()
    bad = [
        ({"model": "nope", "messages": USER}, 404, "model_not_found"),
        ({"model": MODEL_NAME, "messages": USER, "n": 9}, 400, None),
        ({"model": MODEL_NAME, "messages": USER, "temperature": 0, "record": True}, 400,
         None),
        ({"model": MODEL_NAME, "messages": USER, "stream_options": {"include_usage": "yes"}},
         400, "invalid_parameter"),
    ]
    for extra, status, code in bad:
        resp = httpx.post(f"{served.v1}/chat/completions", json={**extra, "stream": True},
                          headers=AUTH, timeout=60)
        assert resp.status_code == status, resp.text
        assert resp.headers["content-type"].startswith("application/json")
        if code is not None:
            assert resp.json()["error"]["code"] == code
    with pytest.raises(openai.BadRequestError, match="include_usage"):
        client.completions.create(model=MODEL_NAME, prompt="x", stream=True,
                                  stream_options={"include_usage": "yes"})  # type: ignore[typeddict-item]
    assert rkeys.snapshot() == before, "a refused request records nothing"


def test_client_leaving_mid_stream_does_not_hurt_the_server(served: Served,
                                                            client: openai.OpenAI) -> None:
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 8, "n": 4, "stream": True}
    for _ in range(3):
        with httpx.stream("POST", f"{served.v1}/chat/completions", json=body, headers=AUTH,
                          timeout=60) as resp:
            first = next(resp.iter_lines())
            assert first.startswith("data: ")
        # closed after one event: the rest of the stream is dropped by the server
    assert httpx.get(f"{served.url}/health", timeout=10).json()["status"] == "ok"
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_episode_turn_streams(served: Served, client: openai.OpenAI, rkeys: RedisKeys) -> None:
    """A turn of a multi-turn episode streams too: text before the turn ends, the turn
    appended to its rollout before the final chunk, the deltas joining to the non-streamed
    turn's text, and the next turn continuing it."""
    resp = httpx.post(f"{served.v1}/groups", json={"size": 1}, headers=AUTH, timeout=30)
    assert resp.status_code == 200, resp.text
    rid, group_id = resp.json()["rollout_ids"][0], resp.json()["group_id"]
    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=USER, max_tokens=40, stream=True, logprobs=True,
        extra_body={"rollout_id": rid, "ignore_eos": True}))
    assert {c.model_extra["group_id"] for c in chunks} == {group_id}
    parts = by_choice(chunks)[0]
    *body, final = parts
    assert final.finish_reason is not None and final.model_extra["rollout_id"] == rid
    covered = [len(p.logprobs.content) for p in body if p.logprobs]
    assert covered and covered[0] < 40, "the turn's first chunk came after its last token"
    rec = stored(rkeys, rid)
    prompt, sampled = final.model_extra["prompt_token_ids"], final.model_extra["token_ids"]
    assert rec.token_ids.tolist() == prompt + sampled
    assert rec.turns == [(len(prompt), len(prompt) + len(sampled))]
    joined = [e.logprob for p in parts if p.logprobs for e in p.logprobs.content]
    np.testing.assert_allclose(rec.logprobs[len(prompt):], joined, atol=1e-6)
    content = "".join(p.delta.content or "" for p in parts)
    nxt = client.chat.completions.create(
        model=MODEL_NAME, max_tokens=4, stream=True, extra_body={"rollout_id": rid},
        messages=[*USER, {"role": "assistant", "content": content},
                  {"role": "user", "content": "go on"}])
    assert [c for c in nxt][-1].choices[0].finish_reason is not None
    assert len(stored(rkeys, rid).turns) == 2, "the streamed turn's content continues it"


LONG: dict[str, Any] = dict(max_tokens=200, temperature=1.0, extra_body={"ignore_eos": True})


def test_text_arrives_while_the_completion_is_generated(client: openai.OpenAI,
                                                        rkeys: RedisKeys) -> None:
    """Order of events, not timing: each chunk carries the log-probabilities of the tokens
    that existed when it was sent, so a text chunk that covers fewer tokens than the
    completion's final count was sent before the completion ended."""
    stream = client.chat.completions.create(model=MODEL_NAME, messages=USER, logprobs=True,
                                            stream=True, **LONG)
    seen: list[int] = []  # tokens covered so far, at each chunk with text
    covered = 0
    first_group_recorded: bool | None = None
    for chunk in stream:
        c = chunk.choices[0]
        covered += len(c.logprobs.content) if c.logprobs and c.logprobs.content else 0
        if c.delta.content and c.finish_reason is None:
            seen.append(covered)
            if first_group_recorded is None:
                group_id = chunk.model_extra["group_id"]
                first_group_recorded = rkeys.client.exists(
                    rkeys.keys.group_rollouts(group_id)) == 1
        if c.finish_reason is not None:
            total = len(c.model_extra["token_ids"])
    assert total == 200 and seen, "no text before the final chunk"
    assert seen[0] < total, "the first text was sent only once every token existed"
    assert len(seen) > 3, f"text came in {len(seen)} pieces: not as it was generated"
    assert first_group_recorded is False, "the group was recorded before the first text"


def test_n_choices_interleave_and_join(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = dict(model=MODEL_NAME, messages=USER, n=2, seed=5, **LONG)
    plain = client.chat.completions.create(**kw)
    order = []
    texts = {0: "", 1: ""}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            if c.delta.content:
                order.append(c.index)
                texts[c.index] += c.delta.content
    assert texts == {i: plain.choices[i].message.content for i in (0, 1)}
    first_1 = order.index(1)
    assert 0 in order[first_1:], f"choice 0 was streamed wholly before choice 1: {order}"


def _disconnected(served: Served) -> float:
    text = httpx.get(served.url + "/metrics", timeout=10).text
    line = 'gspo_requests_disconnected_total{route="/v1/chat/completions"} '
    values = [float(x.split(" ")[-1]) for x in text.splitlines() if x.startswith(line)]
    return values[0] if values else 0.0


def _wait_idle(served: Served) -> dict[str, float]:
    engine = served.app.state.engine
    deadline = time.monotonic() + 120
    while (stats := engine.stats()).running or stats.waiting:
        assert time.monotonic() < deadline, f"engine still busy: {stats}"
        time.sleep(0.05)
    return stats.extra


def test_client_leaving_mid_stream_cancels_the_decoding(served: Served,
                                                        rkeys: RedisKeys) -> None:
    tokens_before = _wait_idle(served).get("tokens_generated", 0.0)
    left_before = _disconnected(served)
    before = rkeys.snapshot()
    body = {"model": MODEL_NAME, "messages": USER, "n": 2, "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{served.v1}/chat/completions", json=body, headers=AUTH,
                      timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # text is flowing: the decoding is under way; leave
    generated = _wait_idle(served).get("tokens_generated", 0.0) - tokens_before
    assert generated < 2 * MAX_TOKENS, "the engine decoded the whole request for nobody"
    time.sleep(0.2)  # a stream that was not cancelled would record right after generation
    assert rkeys.snapshot() == before, "a group was recorded for a client that left"
    assert _disconnected(served) == left_before + 1


def test_failure_after_the_first_byte_is_an_error_event(client: openai.OpenAI,
                                                        rkeys: RedisKeys) -> None:
    """Redis refuses every write (maxmemory reached): the samples stream, then the record
    fails; the client gets the error as an event (the ``openai`` client raises it), never a
    stream that ends as if complete."""
    before = rkeys.snapshot()
    got_text = False
    rkeys.client.config_set("maxmemory", "1")
    try:
        stream = client.chat.completions.create(model=MODEL_NAME, messages=USER, n=2,
                                                max_tokens=20, stream=True)
        with pytest.raises(openai.APIError) as err:
            for chunk in stream:
                assert chunk.choices[0].finish_reason is None, "a final chunk unrecorded"
                got_text = got_text or bool(chunk.choices[0].delta.content)
    finally:
        rkeys.client.config_set("maxmemory", "0")
    assert got_text, "the error came before any text: not a mid-stream failure"
    assert err.value.body is not None and err.value.body["code"] == "redis_out_of_memory"
    assert rkeys.snapshot() == before, "nothing is recorded"


def test_with_tools_the_content_comes_whole_in_the_final_chunk(client: openai.OpenAI) -> None:
    """The tool-call parser may claim any text: with ``tools`` nothing is sent as content
    before the final chunk, which carries what the non-streamed response says."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}}]
    kw: dict[str, Any] = dict(model=MODEL_NAME, messages=USER, tools=tools, n=2, seed=9,
                              max_tokens=30, logprobs=True)
    plain = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    for i, parts in by_choice(chunks).items():
        *body, final = parts
        assert not any(p.delta.content for p in body), "content sent before the parser ran"
        assert len(body) > 2, "the log-probabilities did not stream"
        assert final.delta.content == plain.choices[i].message.content
        assert final.finish_reason == plain.choices[i].finish_reason


def test_engine_stopping_mid_stream_is_an_error_event(tiny_model_dir: Path,
                                                      redis_mod: RedisServer) -> None:
    """The engine stops while a stream is under way (a server shutting down: its scheduler
    ends and aborts what is in flight, as ``HFEngine.shutdown`` makes it): the client gets a
    ``generation_aborted`` error event after the text it already has, and nothing is
    recorded. Its own server: this one's engine does not come back."""
    rkeys = RedisKeys(redis_mod.url, Keys())
    before = rkeys.snapshot()
    with running_server(tiny_model_dir, redis_mod.url, max_tokens=MAX_TOKENS) as own:
        client = openai.OpenAI(base_url=own.v1, api_key=API_KEY, max_retries=0, timeout=60)
        engine = own.app.state.engine
        stream = client.chat.completions.create(model=MODEL_NAME, messages=USER, stream=True,
                                                max_tokens=MAX_TOKENS,
                                                extra_body={"ignore_eos": True})
        with pytest.raises(openai.APIError) as err:
            for chunk in stream:
                assert chunk.choices[0].finish_reason is None, "it ran to its end"
                if chunk.choices[0].delta.content:
                    sched = engine._sched
                    with sched.cond:  # what shutdown() does first: the scheduler stops
                        sched.stopping = True
                        sched.cond.notify_all()
        assert err.value.body is not None and err.value.body["code"] == "generation_aborted"
    assert rkeys.snapshot() == before, "an aborted stream records nothing"
    rkeys.close()


def test_admission_counts_a_streamed_group_until_its_stream_ends(
        tiny_model_dir: Path, redis_server: RedisServer) -> None:
    """With admission control on, a streamed group holds its slot while its text flows (it is
    in flight: sampled, not yet recorded) and gives it back once the stream has ended, as a
    non-streamed request does when its response is sent. (Its own Redis: the groups the other
    tests left open would count as in flight.)"""
    with running_server(tiny_model_dir, redis_server.url, max_tokens=MAX_TOKENS,
                        admission=True) as own:
        gate = own.app.state.admission
        body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 200, "ignore_eos": True,
                "stream": True, "record": True}
        with httpx.stream("POST", f"{own.v1}/chat/completions", json=body, headers=AUTH,
                          timeout=60) as resp:
            assert resp.status_code == 200, resp.read()
            lines = resp.iter_lines()
            for line in lines:
                if '"content":"' in line and '"content":""' not in line:
                    break  # text is flowing
            assert gate.local == 1, "the streamed group is not counted while it streams"
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        deadline = time.monotonic() + 30
        while gate.local:
            assert time.monotonic() < deadline, "the slot was not given back"
            time.sleep(0.05)
