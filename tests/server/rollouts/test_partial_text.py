"""Incremental streaming text (``gspo_rl.server.rollouts.partial_text``) and chunks
(``gspo_rl.server.api.streaming.views``) over a real byte-level BPE tokenizer: every prefix sent is
a prefix of the non-streamed text, multi-byte characters are never split, stop strings and end
tokens are held back, reasoning is never sent as content (nor the reverse), and the ``openai``
library's own stream accumulator assembles the non-streamed message from the chunks."""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from gspo_rl.server.api.errors import APIError
from gspo_rl.server.api.streaming.sse import include_usage
from gspo_rl.server.api.streaming.views import ChatView, CompletionView
from gspo_rl.server.engines.base import Completion, Partial, SamplingParams
from gspo_rl.server.rollouts.chat.render import TokenTexts, completion_text
from gspo_rl.server.rollouts.parsers import parse_assistant
from gspo_rl.server.rollouts.parsers.reasoning import split_reasoning
from gspo_rl.server.rollouts.partial_text import TextStream, remainder, stable_split
from gspo_rl.server.rollouts.protocol import (
    AssistantMessage,
    ChatChoice,
    CompletionChoice,
    FunctionCallOut,
    ToolCallOut,
)
from gspo_rl.server.rollouts.sampling import GenerationPlan
from gspo_rl.server.rollouts.serving.formatting import chat_logprobs, completion_logprobs
from gspo_rl.tiny_model import EOS_TOKEN, build_tokenizer

RL: dict[str, Any] = dict(rollout_id="r", prompt_token_ids=[1], policy_version=0)


@cache
def tok() -> Any:
    return build_tokenizer(512)


def end_ids() -> tuple[int, ...]:
    return (tok().convert_tokens_to_ids(EOS_TOKEN),)


def stream_prefixes(ids: list[int], stop: tuple[str, ...] = ()) -> list[str]:
    ts = TextStream(tok(), end_ids(), stop)
    out = []
    for k in range(1, len(ids) + 1):
        ts.update(ids[:k])
        out.append(ts.stable())
    return out


def final_text(ids: list[int], stop_string: str | None = None, reason: str = "length") -> str:
    c = Completion(ids, [0.0] * len(ids), [0] * len(ids), reason,  # type: ignore[arg-type]
                   stop_string=stop_string)
    return completion_text(tok(), c, end_ids())


def check_prefixes(prefixes: list[str], final: str) -> None:
    for a, b in zip(prefixes, prefixes[1:], strict=False):
        assert b.startswith(a), "a later text contradicts an earlier one"
    assert all(final.startswith(p) for p in prefixes)
    assert all("\ufffd" not in p for p in prefixes) or "\ufffd" in final


def test_multibyte_characters_are_never_split() -> None:
    text = "héllo 日本語 🎉 done"
    ids = tok().encode(text)
    prefixes = stream_prefixes(ids)
    assert all("\ufffd" not in p for p in prefixes)
    check_prefixes(prefixes, text)
    assert prefixes[-1] == text
    assert len(set(prefixes)) > 5, "the text grew as tokens came, not only at the end"


@pytest.mark.parametrize("seed", range(20))
def test_random_tokens_stream_a_prefix_of_the_final_text(seed: int) -> None:
    rng = random.Random(seed)
    ids = [rng.randrange(len(tok())) for _ in range(rng.randint(1, 60))]
    prefixes = stream_prefixes(ids)
    final = final_text(ids)
    check_prefixes(prefixes, final)
    assert remainder(final, prefixes[-1]) == final[len(prefixes[-1]):]


def test_end_token_is_held_back_and_dropped() -> None:
    ids = tok().encode("the end") + list(end_ids())
    prefixes = stream_prefixes(ids)
    assert prefixes[-1] == "the end" == final_text(ids, reason="stop")
    assert EOS_TOKEN not in "".join(prefixes)


def test_stop_string_and_what_may_begin_one_are_held_back() -> None:
    ids = tok().encode("one two STOP three")
    prefixes = stream_prefixes(ids, stop=("STOP", "xyz"))
    final = final_text(ids, stop_string="STOP", reason="stop")
    assert final == "one two "
    check_prefixes(prefixes, final)
    assert not any("S" in p for p in prefixes)


def test_remainder_refuses_a_contradiction() -> None:
    assert remainder(None, "") == "" and remainder("abc", "ab") == "c"
    with pytest.raises(ValueError):
        remainder("abc", "x")


SPLIT_TEXTS = [
    "<think>\nlet me see\n\n</think>\n\nThe answer is 4.",
    "  <think>a</think>b",
    "plain answer with no tags",
    "reasoning without an opening tag</think>\n\nanswer",
    "<think>\ncut off in the middle\n",
    "<thinking is not a tag",
    "<think></think>",
]


@pytest.mark.parametrize("parser", ["none", "qwen3", "deepseek_r1"])
@pytest.mark.parametrize("text", SPLIT_TEXTS)
@pytest.mark.parametrize("thinking", [True, False])
def test_stable_split_only_says_what_the_final_split_says(parser: str, text: str,
                                                          thinking: bool) -> None:
    reasoning, content = split_reasoning(text, parser, thinking)
    for k in range(len(text) + 1):
        r, c = stable_split(text[:k], parser, thinking)
        assert (reasoning or "").startswith(r), (text[:k], r)
        assert (content or "").startswith(c), (text[:k], c)
    if parser == "none" or not thinking:
        assert stable_split(text, parser, thinking) == ("", text)


def test_stable_split_streams_reasoning_then_content() -> None:
    text = SPLIT_TEXTS[0]
    assert stable_split(text[:20], "qwen3", True) == ("let me see", "")
    assert stable_split(text, "qwen3", True) == ("let me see", "The answer is 4.")


# ------------------------------------------------------------------ views


def plan(n: int, stop: tuple[str, ...] = ()) -> GenerationPlan:
    return GenerationPlan([1], SamplingParams(max_tokens=100, stop=stop), n, {}, "chat")


def partials(ids: list[int]) -> list[Partial]:
    lps = [-0.1 * (j + 1) for j in range(len(ids))]
    return [Partial(ids, lps, None, k) for k in range(1, len(ids) + 1)]


def accumulate(payloads: list[dict[str, Any]]) -> Any:
    state = ChatCompletionStreamState()
    for p in payloads:
        state.handle_chunk(ChatCompletionChunk.model_validate(
            {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [p]}))
    return state.get_final_completion().choices[0].message


@pytest.mark.parametrize("parser,with_tools,text", [
    ("none", False, "héllo 日本語, plain text"),
    ("qwen3", False, "<think>\nhmm 🤔\n</think>\n\nThe answer."),
    ("qwen3", False, "no tags at all"),
    ("deepseek_r1", True, 'thinking</think>ok <tool_call>\n{"name": "f", "arguments": '
                          '{"x": 1}}\n</tool_call>'),
    ("none", True, "a <tool_call>broken</tool_call> call stays content"),
])
def test_chat_view_chunks_accumulate_to_the_non_streamed_message(
        parser: str, with_tools: bool, text: str) -> None:
    ids = tok().encode(text) + list(end_ids())
    view = ChatView(tok(), TokenTexts(tok()), end_ids(), plan(1), 0,
                    reasoning_parser=parser, thinking=True, with_tools=with_tools)
    chunks = view.opening(1)
    progress = [view.progress(0, p) for p in partials(ids)]
    chunks += [c for c in progress if c is not None]
    comp = Completion(ids, partials(ids)[-1].logprobs, [0] * len(ids), "stop")
    parsed = parse_assistant(final_text(ids, reason="stop"), tool_parser="hermes",
                             reasoning_parser=parser, with_tools=with_tools)
    calls = [ToolCallOut(id=t.id, function=FunctionCallOut(name=t.name, arguments=t.arguments))
             for t in parsed.calls] or None
    choice = ChatChoice(index=0, message=AssistantMessage(
        content=parsed.content, reasoning_content=parsed.reasoning, tool_calls=calls),
        finish_reason="tool_calls" if calls else "stop",
        logprobs=chat_logprobs(TokenTexts(tok()), comp, 0), token_ids=ids,
        policy_versions=[0] * len(ids), **RL)
    chunks.append(view.final(0, choice))
    got = accumulate(chunks)
    assert got.content == parsed.content
    assert getattr(got, "reasoning_content", None) == parsed.reasoning
    assert [c.function.name for c in got.tool_calls or []] == [c.name for c in parsed.calls]
    sent = [c["logprobs"]["content"] for c in chunks[1:] if c.get("logprobs")]
    assert [e["logprob"] for part in sent for e in part] == comp.logprobs
    streamed = [c for c in progress if c is not None and c["delta"]]
    if with_tools:  # content is held back to the final chunk
        assert not any("content" in c["delta"] for c in streamed)
    if parsed.reasoning and not with_tools:
        assert any("reasoning_content" in c["delta"] for c in streamed)
        assert any("content" in c["delta"] for c in streamed)


def test_completion_view_text_and_logprobs_join_to_the_non_streamed_ones() -> None:
    texts = TokenTexts(tok())
    ids = tok().encode("Once upon a time, 日本 🎉 the end")
    view = CompletionView(tok(), texts, end_ids(), plan(1), 1)
    comp = Completion(ids, partials(ids)[-1].logprobs, [0] * len(ids), "length",
                      top_logprobs=[[(t, -0.1)] for t in ids])
    ps = [Partial(ids, comp.logprobs, comp.top_logprobs, p.length) for p in partials(ids)]
    chunks = [c for c in (view.progress(0, p) for p in ps) if c is not None]
    want = completion_logprobs(texts, comp, 1)
    choice = CompletionChoice(index=0, text=final_text(ids), finish_reason="length",
                              logprobs=want, token_ids=ids, policy_versions=[0] * len(ids),
                              **RL)
    chunks.append(view.final(0, choice))
    assert "".join(c["text"] for c in chunks) == choice.text
    assert len(chunks) > 3, "text was sent as it came"
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        joined = [x for c in chunks if c["logprobs"] for x in c["logprobs"][key]]
        assert joined == getattr(want, key), key


def test_include_usage_must_be_a_bool() -> None:
    assert include_usage(None) is False and include_usage({}) is False
    assert include_usage({"include_usage": True}) is True
    with pytest.raises(APIError) as err:
        include_usage({"include_usage": "yes"})
    assert err.value.status == 400
