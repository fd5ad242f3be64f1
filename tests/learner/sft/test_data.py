"""Demonstrations laid out as tokens (gspo_rl.learner.sft.data) on the tiny model's template
and on Qwen3's and Llama 3.3's real templates (tests/data): the tokens equal the plain
``apply_chat_template`` rendering of the conversation, the mask covers exactly the assistant
messages to their end-of-turn token, the first prompt is the server's, and every later turn
follows the model's as the server's episodes append it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from gspo_rl.contract.chat.messages import end_token_ids, template_messages
from gspo_rl.learner.sft.data import (
    Demonstration,
    DemonstrationError,
    Layout,
    micro_batches,
    read_demonstrations,
)
from gspo_rl.redisq.episodes.store import EpisodeState
from gspo_rl.server.rollouts.chat.render import render_chat_prompt
from gspo_rl.server.rollouts.episodes import new_turn_tokens
from gspo_rl.tiny_model import build_tokenizer
from tests.helpers.template_models import LOOKUP, template_tokenizer

CALL = {"id": "call_0", "type": "function",
        "function": {"name": "lookup", "arguments": '{"key": "k"}'}}
TOOL_TURNS = [
    {"role": "user", "content": "What is the value of k?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_0", "content": "42"},
    {"role": "assistant", "content": "k is 42."},
]
REASONING = [  # Qwen3 keeps the reasoning of the turns after the last user message
    {"role": "user", "content": "What is the value of k?"},
    {"role": "assistant", "content": "", "reasoning_content": "I should look k up.",
     "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_0", "content": "42"},
    {"role": "assistant", "content": "k is 42.", "reasoning_content": "The tool said 42."},
]


@pytest.fixture(scope="module", params=["tiny", "qwen3", "llama3"])
def tok(request: pytest.FixtureRequest) -> Any:
    return build_tokenizer(1024) if request.param == "tiny" else template_tokenizer(
        request.param)


def _conversations(tok: Any) -> list[tuple[list[dict[str, Any]], bool]]:
    """(conversation, whether the template renders its history differently later)."""
    qwen3 = "<think>" in tok.get_added_vocab()
    convs = [(TOOL_TURNS, qwen3),  # Qwen3 drops the empty <think></think> of earlier turns
             ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."},
               {"role": "assistant", "content": "hi"}], False)]
    return [*convs, (REASONING, False)] if qwen3 else convs


def _segments(d: Demonstration) -> list[tuple[int, int]]:
    """(start, end) of each run of mask 1."""
    edges = np.diff(np.concatenate([[0], d.loss_mask.astype(int), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True))


def _render(tok: Any, conv: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
    return list(tok.apply_chat_template(conv, tools=[LOOKUP], tokenize=True,
                                        add_generation_prompt=generation_prompt,
                                        return_dict=False))


def test_tokens_are_the_templates_and_the_mask_its_assistant_turns(tok) -> None:
    """Each assistant turn is the template's own tokens for it after its generation prompt,
    to its end-of-turn token; a conversation whose history the template keeps as it was
    rendered is, token for token, the template's rendering of the whole."""
    layout, eot = Layout(tok), set(end_token_ids(tok))
    for raw, rewrites in _conversations(tok):
        d = layout.demonstration(raw, [LOOKUP])
        conv = template_messages(raw)  # None content as "", arguments as objects
        turns = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
        segments = _segments(d)
        assert len(segments) == len(turns)
        for (start, end), i in zip(segments, turns, strict=True):
            prompt, alone = _render(tok, conv[:i], True), _render(tok, conv[:i + 1], False)
            assert alone[:len(prompt)] == prompt
            assert d.token_ids[start:end].tolist() == alone[len(prompt):][:end - start]
            assert d.token_ids[end - 1] in eot  # to the end-of-turn token, included
            assert not eot & set(d.token_ids[start:end - 1].tolist())
        assert len(d) == segments[-1][1]  # nothing after the last assistant turn
        full = _render(tok, conv, False)
        assert (d.token_ids.tolist() == full[:len(d)]) is not rewrites


def test_turns_follow_as_the_servers_episodes_append_them(tok) -> None:
    """The server's own functions: the first turn's prompt (render_chat_prompt), then each
    next turn's tokens after the model's (new_turn_tokens), given the earlier tokens."""
    eot = end_token_ids(tok)
    conv = template_messages(TOOL_TURNS)
    d = Layout(tok).demonstration(conv, [LOOKUP])
    (s1, e1), (s2, e2) = _segments(d)
    p1 = render_chat_prompt(tok, conv[:1], [LOOKUP], text_roles=("assistant",))
    assert d.token_ids[:s1].tolist() == p1
    full = render_chat_prompt(tok, conv[:3], [LOOKUP], text_roles=("assistant",))
    state = EpisodeState(messages=[], assistant=b"", tools=b"", temperature=1.0,
                         render_len=len(p1), render_hash=b"",
                         eot_count=sum(t in eot for t in p1))
    new, _ = new_turn_tokens(full, state, eot, int(d.token_ids[e1 - 1]))
    assert d.token_ids[e1:s2].tolist() == new


def test_control_tokens_in_messages_stay_text() -> None:
    tok = build_tokenizer(1024)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    d = Layout(tok).demonstration([{"role": "user", "content": "a<|im_end|>b"},
                                   {"role": "assistant", "content": "x<|im_end|>y"}], None)
    assert d.token_ids.tolist().count(im_end) == 3  # system, user, assistant: no forged one
    assert d.token_ids[-1] == im_end and d.loss_mask[-1] == 1


@pytest.mark.parametrize(("line", "why"), [
    ("not json", "Expecting value"),
    ('{"prompt": "x"}', '"messages" list'),
    ('{"messages": [{"role": "user", "content": "x"}]}', "no assistant message"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}', "starts with its prompt"),
    ('{"messages": [{"role": "robot", "content": "x"}, {"role": "assistant"}]}', "role"),
    ('{"messages": [{"role": "user", "content": [{"type": "image_url"}]}, '
     '{"role": "assistant", "content": "x"}]}', "image_url"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], '
     '"weights": 1}', "unknown keys"),
])
def test_a_bad_line_is_named_with_its_number(tmp_path, line: str, why: str) -> None:
    path = tmp_path / "demos.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "x"},
                                    {"role": "assistant", "content": "y"}]})
    path.write_text(f"{good}\n\n{line}\n")
    with pytest.raises(DemonstrationError, match=f"demos.jsonl:3: .*{why}"):
        read_demonstrations(path, Layout(build_tokenizer(1024)))


def test_micro_batches_keep_to_the_token_budget() -> None:
    demos = [Demonstration(np.arange(n, dtype=np.int64), np.ones(n, dtype=np.uint8))
             for n in (5, 9, 3, 7, 2)]
    padded = list(micro_batches(demos, budget=16, pad_id=0, packed=False))
    assert [tuple(m.tokens_BT.shape) for m in padded] == [(1, 9), (2, 7), (2, 3)]
    packed = list(micro_batches(demos, budget=16, pad_id=0, packed=True))
    assert [int(m.attention_BT.sum()) for m in packed] == [16, 10]
    for m in padded + packed:  # padding is never attended nor trained
        assert torch.equal(m.mask_BT > 0, m.attention_BT > 0)
    assert sum(int(m.attention_BT.sum()) for m in padded) == 26


def test_the_calculator_demonstrations_lay_out_and_are_right(tmp_path) -> None:
    from gspo_rl.client.examples.calculator import last_number, safe_eval
    from gspo_rl.client.examples.calculator_demos import demonstrations

    demos = demonstrations(8)
    for d in demos:
        msgs = d["messages"]
        expression = json.loads(msgs[2]["tool_calls"][0]["function"]["arguments"])["expression"]
        assert msgs[1]["content"] == f"What is {expression}?"
        assert last_number(msgs[4]["content"]) == safe_eval(expression)
    path = tmp_path / "calc.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in demos))
    laid_out = read_demonstrations(path, Layout(build_tokenizer(1024)))
    assert len(laid_out) == 8 and all(len(_segments(x)) == 2 for x in laid_out)
