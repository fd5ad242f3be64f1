"""Incremental text of a completion being streamed: what may be sent before it ends.

The rule: every delta sent is part of a prefix of what the non-streamed response will say, so
the joined deltas plus the final chunk's remainder are exactly the non-streamed message (the
final chunk sends ``final[len(sent):]``; ``remainder`` checks the prefix). What is held back:

- an incomplete UTF-8 character (a token that ends inside one decodes to U+FFFD): the text
  is decoded in a window of the latest tokens (the prefix/read offsets of vLLM's and TGI's
  incremental detokenizers) and only grows when the window's text does not end in U+FFFD;
- a trailing end-of-turn / EOS token: the non-streamed text drops the token that stopped it;
- stop strings: text from the earliest stop string on, and the last ``len(longest) - 1``
  characters (they may begin one);
- reasoning (``stable_split``): text that the reasoning parser could still move between
  ``reasoning_content`` and ``content``.

Pure functions and a small state object over a tokenizer's ``decode``: no I/O.
"""

from __future__ import annotations

from typing import Any

from gspo_rl.server.rollouts.parsers.reasoning import THINK_CLOSE, THINK_OPEN

REPLACEMENT = "\ufffd"


class TextStream:
    """The decoded text of one completion, grown token by token (module docstring)."""

    def __init__(self, tokenizer: Any, end_ids: tuple[int, ...],
                 stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        # A fast tokenizer's backend decodes exactly as ``tokenizer.decode`` when no clean-up
        # of spaces runs after it, at a third of the cost (no argument conversion).
        backend = getattr(tokenizer, "_tokenizer", None)
        self.backend = (backend if backend is not None
                        and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
                        else None)
        self.end_ids = frozenset(end_ids)
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # the decoded text of tokens [0, read_offset)
        self.prefix_offset = 0
        self.read_offset = 0
        self.prefix_len = 0  # len(decode(ids[prefix_offset:read_offset])): fixed until both move

    def _decode(self, ids: list[int]) -> str:
        if self.backend is not None:
            return self.backend.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def update(self, token_ids: list[int], length: int | None = None) -> None:
        """Takes the completion's tokens so far: the first ``length`` of ``token_ids`` (all
        of them when None; the whole list, not only the new ones)."""
        n = len(token_ids) if length is None else length
        if n and token_ids[n - 1] in self.end_ids:
            n -= 1  # it ends the completion; the final text may drop it
        if n <= self.read_offset:
            return
        window = self._decode(token_ids[self.prefix_offset:n])
        if len(window) > self.prefix_len and not window.endswith(REPLACEMENT):
            self.text += window[self.prefix_len:]
            self.prefix_offset, self.read_offset = self.read_offset, n
            self.prefix_len = len(self._decode(token_ids[self.prefix_offset:n]))

    def stable(self) -> str:
        """The text that is certain to begin the final text (stop strings held back)."""
        if not self.stop:
            return self.text
        cut = min((i for i in (self.text.find(s) for s in self.stop) if i >= 0),
                  default=len(self.text) - self.hold)
        return self.text[:max(cut, 0)]


def _hold_partial(text: str, marker: str) -> str:
    """``text`` without a suffix that may be the start of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return text[:-k]
    return text


def stable_split(text: str, parser: str, thinking: bool) -> tuple[str, str]:
    """(reasoning, content) prefixes of what
    ``gspo_rl.server.rollouts.parsers.reasoning.split_reasoning`` will make of any text that begins
    with ``text``. ``qwen3`` without a leading ``<think>``: all held (a later ``</think>`` would
    turn the text before it into reasoning)."""
    if parser == "none" or not thinking:
        return "", text
    close = text.find(THINK_CLOSE)
    if close >= 0:
        before, after = text[:close], text[close + len(THINK_CLOSE):]
        stripped = before.lstrip()
        body = stripped[len(THINK_OPEN):] if stripped.startswith(THINK_OPEN) else before
        return body.strip("\n"), after.lstrip("\n")
    body = _hold_partial(text, THINK_CLOSE)
    stripped = body.lstrip()
    if len(stripped) < len(THINK_OPEN) and THINK_OPEN.startswith(stripped):
        return "", ""  # may still open with <think>
    if stripped.startswith(THINK_OPEN):
        body = stripped[len(THINK_OPEN):]
    elif parser == "qwen3":
        return "", ""
    return body.lstrip("\n").rstrip("\n"), ""


def remainder(final: str | None, sent: str) -> str:
    """What is left of ``final`` after the deltas ``sent`` (which must begin it)."""
    final = final or ""
    if not final.startswith(sent):
        raise ValueError(f"streamed text {sent[-40:]!r} is not a prefix of the final text")
    return final[len(sent):]
