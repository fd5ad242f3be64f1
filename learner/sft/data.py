"""Chat demonstrations into token trajectories: the tokens a multi-turn episode would record had
the model written the demonstration's assistant messages, and the loss mask (1 on those
messages' tokens, end-of-turn token included; 0 on everything else).

Layout (the episode's rule, ``gspo_rl.contract.chat.turns``): the first assistant message's
prompt is the template's rendering of the messages before it with the generation prompt
(sanitised like the server's episodes: ``gspo_rl.contract.chat.sanitize``); an assistant
message's tokens are what the template renders for it after that generation prompt, up to its
end-of-turn token; between two assistant messages come the tokens that follow the model's turn
in the next turn's rendering. So a model warmed up here is trained on exactly the token layout
its RL episodes will hold. Messages after the last assistant message are not used.

A line of the JSONL: ``{"messages": [...], "tools": [...]}`` (``tools`` optional), OpenAI chat
messages; an invalid line raises ``DemonstrationError`` with its line number.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jinja2 import TemplateError

from gspo_rl.contract.chat.messages import ContentError, end_token_ids, template_messages
from gspo_rl.contract.chat.sanitize import ALL_ROLES, chat_text, encode_marked
from gspo_rl.contract.chat.turns import after_turn, count_eot

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class DemonstrationError(ValueError):
    """A demonstration that cannot be laid out (the message says which and why)."""


@dataclass(frozen=True)
class Demonstration:
    """One conversation as tokens: ``token_ids`` and ``loss_mask`` (1: an assistant token)."""

    token_ids: np.ndarray  # int64 [T]
    loss_mask: np.ndarray  # uint8 [T]

    def __len__(self) -> int:
        return len(self.token_ids)


def check_line(obj: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) of one parsed JSONL line, or ``DemonstrationError``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        raise DemonstrationError('expected an object with a "messages" list')
    unknown = sorted(set(obj) - {"messages", "tools"})
    if unknown:
        raise DemonstrationError(f"unknown keys {unknown}: a line holds messages and tools")
    messages, tools = obj["messages"], obj.get("tools")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise DemonstrationError(f"messages[{i}] must be an object whose role is one of "
                                     f"{sorted(ROLES)}")
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        raise DemonstrationError("no assistant message: nothing to learn from")
    if roles[0] == "assistant":
        raise DemonstrationError("the first message is the assistant's: a demonstration "
                                 "starts with its prompt (system or user)")
    if tools is not None and not (isinstance(tools, list)
                                  and all(isinstance(t, dict) for t in tools)):
        raise DemonstrationError('"tools" must be a list of tool objects')
    return messages, tools or None


class Layout:
    """Lays out conversations for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None,
                 sanitize_control_tokens: bool = True) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise DemonstrationError("the model's tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.kwargs = dict(template_kwargs or {})
        self.roles = ALL_ROLES if sanitize_control_tokens else frozenset({"assistant"})
        self.sanitize_tools = sanitize_control_tokens
        self.eot = frozenset(end_token_ids(tokenizer))

    def _text(self, msgs: list[dict[str, Any]], tools: Any, generation_prompt: bool) -> str:
        return chat_text(self.tokenizer, msgs, tools, sanitize_roles=self.roles,
                         sanitize_tools=self.sanitize_tools, template_kwargs=self.kwargs,
                         add_generation_prompt=generation_prompt)

    def _assistant_ids(self, msgs: list[dict[str, Any]], i: int, prompt: str,
                       tools: Any) -> list[int]:
        """Message ``i``'s tokens: its rendering after the generation prompt, to its
        end-of-turn token."""
        text = self._text(msgs[:i + 1], tools, generation_prompt=False)
        if not text.startswith(prompt):
            raise DemonstrationError(
                f"messages[{i}]: the chat template does not render the assistant message "
                "after its generation prompt, so its tokens cannot be found")
        ids = encode_marked(self.tokenizer, text[len(prompt):], middle=True)
        end = next((j for j, t in enumerate(ids) if t in self.eot), None)
        if end is None:
            raise DemonstrationError(f"messages[{i}]: no end-of-turn token after the "
                                     "assistant message in the template's rendering")
        return ids[:end + 1]

    def demonstration(self, messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None) -> Demonstration:
        try:
            msgs = template_messages(messages)
            return self._layout(msgs, tools)
        except (ContentError, TemplateError) as exc:
            raise DemonstrationError(str(exc)) from exc

    def _layout(self, msgs: list[dict[str, Any]], tools: Any) -> Demonstration:
        ids: list[int] = []
        mask: list[int] = []
        eot_count = 0
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            prompt = self._text(msgs[:i], tools, generation_prompt=True)
            full = encode_marked(self.tokenizer, prompt)
            new = full if not ids else after_turn(full, eot_count, self.eot, ids[-1])
            if new is None:
                raise DemonstrationError(
                    f"messages[{i}]: the template's rendering has no end-of-turn token after "
                    "the previous assistant turn: not supported for multi-turn (as episodes)")
            eot_count = count_eot(full, self.eot)
            turn = self._assistant_ids(msgs, i, prompt, tools)
            ids += new + turn
            mask += [0] * len(new) + [1] * len(turn)
        return Demonstration(np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.uint8))


def read_demonstrations(path: Path, layout: Layout) -> list[Demonstration]:
    """Every line of the JSONL at ``path`` laid out; a bad line raises
    ``DemonstrationError`` naming ``path:line``. Blank lines are skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append(layout.demonstration(*check_line(json.loads(line))))
            except (ValueError, DemonstrationError) as exc:  # JSONDecodeError is a ValueError
                raise DemonstrationError(f"{path}:{n}: {exc}") from exc
    if not out:
        raise DemonstrationError(f"{path}: no demonstrations")
    return out


@dataclass(frozen=True)
class MicroBatch:
    """Right-padded rows: tokens, attention (1: a real token) and the loss mask."""

    tokens_BT: torch.Tensor  # int64
    attention_BT: torch.Tensor  # int64
    mask_BT: torch.Tensor  # float32


def micro_batches(demos: Sequence[Demonstration], budget: int, pad_id: int,
                  packed: bool) -> Iterator[MicroBatch]:
    """``demos`` (longest first) in microbatches of at most ``budget`` tokens: rows x the
    longest row when padded, the sum of the lengths when packed; a longer demonstration is a
    microbatch of its own."""
    order = sorted(demos, key=len, reverse=True)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order):
            cost = sum(len(d) for d in order[start:end + 1]) if packed \
                else (end + 1 - start) * len(order[start])
            if cost > budget:
                break
            end += 1
        yield _pad(order[start:end], pad_id)
        start = end


def _pad(rows: Sequence[Demonstration], pad_id: int) -> MicroBatch:
    width = max(len(d) for d in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.float32)
    for r, d in enumerate(rows):
        n = len(d)
        tokens[r, :n] = torch.from_numpy(d.token_ids)
        attention[r, :n] = 1
        mask[r, :n] = torch.from_numpy(d.loss_mask.astype(np.float32))
    return MicroBatch(tokens, attention, mask)
