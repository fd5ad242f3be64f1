"""Tool-call and reasoning parsers (gspo_rl.server.rollouts.parsers): pure text -> (content,
reasoning, calls)."""

from __future__ import annotations

import json

import pytest

from gspo_rl.server.rollouts.parsers import parse_assistant
from gspo_rl.server.rollouts.parsers.reasoning import split_reasoning
from gspo_rl.server.rollouts.parsers.tool_calls import convert_value, parse_calls

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {
        "key": {"type": "string"}, "n": {"type": "integer"}, "x": {"type": "number"},
        "ok": {"type": "boolean"}, "tags": {"type": "array"}}}}}]


def _calls(text: str, parser: str) -> tuple[str | None, list[tuple[str, dict]]]:
    content, calls = parse_calls(text, parser, TOOLS)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def test_hermes() -> None:
    text = 'ok\n<tool_call>\n{"name": "lookup", "arguments": {"key": "k"}}\n</tool_call>'
    assert _calls(text, "hermes") == ("ok", [("lookup", {"key": "k"})])


@pytest.mark.parametrize("text", [
    '{"name": "lookup", "parameters": {"key": "k"}}',
    '<|python_tag|>{"name": "lookup", "parameters": {"key": "k"}}',
    '  {"name": "lookup", "arguments": "{\\"key\\": \\"k\\"}"}\n',
])
def test_llama3_json(text: str) -> None:
    assert _calls(text, "llama3_json") == (None, [("lookup", {"key": "k"})])


def test_llama3_json_several_and_malformed() -> None:
    two = '{"name": "lookup", "parameters": {"key": "a"}}; {"name": "lookup", "parameters": {}}'
    assert _calls(two, "llama3_json")[1] == [("lookup", {"key": "a"}), ("lookup", {})]
    for text in ("The key is k.", '{"name": "lookup", "parameters": {"key": "k"}',
                 '{"parameters": {}}', '{"name": "lookup", "parameters": [1]} trailing',
                 '[{"name": "lookup"}]'):
        assert parse_calls(text, "llama3_json", TOOLS) == (text, [])


def test_mistral_forms() -> None:
    listed = 'Sure.[TOOL_CALLS][{"name": "lookup", "arguments": {"key": "k"}}]'
    assert _calls(listed, "mistral") == ("Sure.", [("lookup", {"key": "k"})])
    v11 = '[TOOL_CALLS]lookup[ARGS]{"key": "a"}[TOOL_CALLS]lookup{"key": "b"}'
    assert _calls(v11, "mistral") == (None, [("lookup", {"key": "a"}), ("lookup", {"key": "b"})])
    for bad in ("[TOOL_CALLS][{\"name\": \"lookup\"", "[TOOL_CALLS]lookup[ARGS]{oops}"):
        assert parse_calls(bad, "mistral", TOOLS) == (bad, [])


def test_qwen3_coder_converts_by_schema() -> None:
    text = ("Let me look.\n<tool_call>\n<function=lookup>\n<parameter=key>\nk 1\n</parameter>\n"
            "<parameter=n>\n3\n</parameter>\n<parameter=x>\n2.5\n</parameter>\n"
            "<parameter=ok>\ntrue\n</parameter>\n<parameter=tags>\n[\"a\"]\n</parameter>\n"
            "</function>\n</tool_call>")
    assert _calls(text, "qwen3_coder") == ("Let me look.", [
        ("lookup", {"key": "k 1", "n": 3, "x": 2.5, "ok": True, "tags": ["a"]})])
    cut = "<tool_call>\n<function=lookup>\n<parameter=key>\nk"
    assert parse_calls(cut, "qwen3_coder", TOOLS) == (cut, [])
    assert convert_value("\nnot a number\n", {"type": "integer"}) == "not a number"
    assert convert_value("null", {"type": "integer"}) is None


def test_qwen3_reasoning() -> None:
    assert split_reasoning("<think>\nplan\n</think>\n\nanswer", "qwen3") == ("plan", "answer")
    assert split_reasoning("<think>\ncut off by max_tok", "qwen3") == ("cut off by max_tok", None)
    assert split_reasoning("plain answer", "qwen3") == (None, "plain answer")
    assert split_reasoning("<think>x</think>y", "qwen3", thinking=False) == (None,
                                                                            "<think>x</think>y")
    assert split_reasoning("<think>x</think>y", "none") == (None, "<think>x</think>y")


def test_deepseek_r1_reasoning_starts_in_the_prompt() -> None:
    assert split_reasoning("plan\n</think>\n\nanswer", "deepseek_r1") == ("plan", "answer")
    assert split_reasoning("still thinking", "deepseek_r1") == ("still thinking", None)


def test_reasoning_then_tool_calls() -> None:
    text = ('<think>\nI need k: <tool_call>not a call</tool_call>\n</think>\n\n'
            '<tool_call>\n{"name": "lookup", "arguments": {"key": "k"}}\n</tool_call>')
    got = parse_assistant(text, tool_parser="hermes", reasoning_parser="qwen3", with_tools=True)
    assert got.reasoning == "I need k: <tool_call>not a call</tool_call>"
    assert got.content is None and [c.name for c in got.calls] == ["lookup"]
    off = parse_assistant(text, tool_parser="hermes", reasoning_parser="qwen3",
                          with_tools=False)
    assert off.calls == [] and off.content is not None and "<tool_call>" in off.content


@pytest.mark.vllm
def test_tool_parsers_agree_with_vllms() -> None:
    """Same calls as vLLM's parsers of the same names on well-formed outputs (content compared
    stripped: ours strips whitespace around the calls). We keep our own: one implementation
    for both engines, so an episode's echoed message compares the same on either."""
    from vllm.tool_parsers import ToolParserManager

    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    except ImportError:  # older vLLM layout
        from vllm.entrypoints.openai.protocol import ChatCompletionRequest

    from tests.helpers.template_models import template_tokenizer

    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}],
                                    tools=TOOLS)
    qwen3, llama3 = template_tokenizer("qwen3"), template_tokenizer("llama3")
    cases = [
        ("hermes", qwen3, 'ok\n<tool_call>\n{"name": "lookup", "arguments": {"key": "k"}}\n'
                          '</tool_call>'),
        ("llama3_json", llama3, '<|python_tag|>{"name": "lookup", "parameters": {"key": "k"}}'),
        ("llama3_json", llama3, '{"name": "lookup", "parameters": {"key": "a"}}; '
                                '{"name": "lookup", "parameters": {"n": 1}}'),
        ("llama3_json", llama3, "The key is k."),
        ("qwen3_coder", qwen3, "Let me look.\n<tool_call>\n<function=lookup>\n<parameter=key>"
                               "\nk 1\n</parameter>\n<parameter=n>\n3\n</parameter>\n"
                               "</function>\n</tool_call>"),
    ]
    for name, tok, text in cases:
        theirs = ToolParserManager.get_tool_parser(name)(tok).extract_tool_calls(text, request)
        content, calls = parse_calls(text, name, TOOLS)
        assert (content or "").strip() == (theirs.content or "").strip(), (name, text)
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            (c.function.name, json.loads(c.function.arguments)) for c in theirs.tool_calls]
