"""Reasoning parsers: split a completion's text into (reasoning, content), vLLM's names.

- ``none``: everything is content.
- ``qwen3``: Qwen3 writes ``<think>reasoning</think>content``. Without ``</think>``: an open
  ``<think>`` means the reasoning was cut (``max_tokens``), all of it is reasoning; no tag at
  all means no reasoning (``enable_thinking: false``, or a model that did not think).
- ``deepseek_r1``: the template opens ``<think>`` in the prompt, so the text usually starts
  inside the reasoning: everything up to ``</think>`` is reasoning; without ``</think>`` all of
  it is (the model was cut before it answered).

Pure string functions: the stored trajectory keeps the sampled ids whatever the client sees.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from gspo_rl.server.config import ReasoningParserName

REASONING_PARSERS: tuple[str, ...] = get_args(ReasoningParserName)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
Split = tuple[str | None, str | None]


def _or_none(text: str) -> str | None:
    return text or None


def _after_open(text: str) -> str:
    """The text after a leading ``<think>`` (whitespace before it allowed)."""
    stripped = text.lstrip()
    return stripped[len(THINK_OPEN):] if stripped.startswith(THINK_OPEN) else text


def split_none(text: str) -> Split:
    return None, text


def split_qwen3(text: str) -> Split:
    if THINK_CLOSE in text:
        reasoning, _, content = text.partition(THINK_CLOSE)
        return _or_none(_after_open(reasoning).strip("\n")), _or_none(content.lstrip("\n"))
    if text.lstrip().startswith(THINK_OPEN):
        return _or_none(_after_open(text).strip("\n")), None
    return None, text


def split_deepseek_r1(text: str) -> Split:
    if THINK_CLOSE in text:
        return split_qwen3(text)
    return _or_none(_after_open(text).strip("\n")), None


PARSERS: dict[str, Callable[[str], Split]] = {
    "none": split_none, "qwen3": split_qwen3, "deepseek_r1": split_deepseek_r1}


def split_reasoning(text: str, parser: str, thinking: bool = True) -> Split:
    """(reasoning, content) of ``text`` by ``parser``. ``thinking=False`` (the request's
    ``chat_template_kwargs.enable_thinking``) turns reasoning extraction off, as in vLLM."""
    if not thinking:
        return None, text
    return PARSERS[parser](text)
