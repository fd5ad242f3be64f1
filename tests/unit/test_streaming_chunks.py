"""The buffered SSE chunks of ``server.streaming`` (episode turns), read back by the
``openai`` library's own stream accumulator: what a client assembles from the chunks is the
non-streamed response (tool calls, reasoning, logprobs and the RL fields included)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from server.api_models import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionResponse,
    ChoiceLogprobs,
    FunctionCallOut,
    TokenLogprob,
    ToolCallOut,
    Usage,
)
from server.errors import APIError
from server.streaming import chat_chunks, include_usage

RL = dict(token_ids=[5, 6], prompt_token_ids=[1, 2, 3], policy_version=4,
          policy_versions=[4, 5])
USAGE = Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7)


def events(stream: Any) -> list[dict[str, Any]]:
    raw = list(stream)
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in raw)
    assert raw[-1] == "data: [DONE]\n\n"
    return [json.loads(e[len("data: "):]) for e in raw[:-1]]


def chat_resp() -> ChatCompletionResponse:
    lp = ChoiceLogprobs(content=[TokenLogprob(token="a", logprob=-0.5, bytes=[97],
                                              top_logprobs=[]),
                                 TokenLogprob(token="b", logprob=-1.5, bytes=[98],
                                              top_logprobs=[])])
    calls = [ToolCallOut(id="call_1", function=FunctionCallOut(name="f", arguments='{"x":1}')),
             ToolCallOut(id="call_2", function=FunctionCallOut(name="g", arguments="{}"))]
    choices = [
        ChatChoice(index=0, message=AssistantMessage(content="hi", reasoning_content="hmm"),
                   finish_reason="stop", logprobs=lp, rollout_id="r0", **RL),
        ChatChoice(index=1, message=AssistantMessage(content=None, tool_calls=calls),
                   finish_reason="tool_calls", logprobs=lp, rollout_id="r1", **RL),
    ]
    return ChatCompletionResponse(id="chatcmpl-g", created=1, model="m", choices=choices,
                                  usage=USAGE, group_id="g")


@pytest.mark.parametrize("with_usage", [False, True])
def test_openai_accumulates_chat_chunks_into_the_response(with_usage: bool) -> None:
    resp = chat_resp()
    payloads = events(chat_chunks(resp, with_usage))
    state = ChatCompletionStreamState()
    for p in payloads:
        state.handle_chunk(ChatCompletionChunk.model_validate(p))
    final = state.get_final_completion()
    for got, want in zip(final.choices, resp.choices, strict=True):
        assert got.message.content == want.message.content
        assert got.finish_reason == want.finish_reason
        assert [e.logprob for e in got.logprobs.content] == [-0.5, -1.5]
        want_calls = [(c.id, c.function.name, c.function.arguments)
                      for c in want.message.tool_calls or []]
        assert [(c.id, c.function.name, c.function.arguments)
                for c in got.message.tool_calls or []] == want_calls
    assert all(p["object"] == "chat.completion.chunk" and p["group_id"] == "g"
               for p in payloads)
    finals = [c for p in payloads for c in p["choices"] if c["finish_reason"] is not None]
    assert [c["rollout_id"] for c in finals] == ["r0", "r1"]
    assert all(c[k] == v for c in finals for k, v in RL.items())
    assert finals[0]["delta"]["reasoning_content"] == "hmm"
    if with_usage:
        assert payloads[-1]["choices"] == [] and payloads[-1]["usage"] == USAGE.model_dump()
        assert all(p["usage"] is None for p in payloads[:-1])
        assert final.usage is not None and final.usage.total_tokens == 7
    else:
        assert all("usage" not in p for p in payloads)


def test_include_usage_must_be_a_bool() -> None:
    assert include_usage(None) is False and include_usage({}) is False
    assert include_usage({"include_usage": True}) is True
    with pytest.raises(APIError) as err:
        include_usage({"include_usage": "yes"})
    assert err.value.status == 400
