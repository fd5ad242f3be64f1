"""Chat templating to token ids, safe under concurrency, with control tokens in messages
encoded as plain text.

Control tokens are the tokenizer's *special* tokens (``<|im_end|>``, ``<|eot_id|>``...): a
message that spells one must not forge a turn boundary. Added tokens that are not special
(Qwen3's ``<think>``) are ordinary vocabulary and are encoded as the tokens they are. Method,
the same as transformers 5.20's ``sanitize_control_tokens=True`` but on every version: wrap
every special token found in the chosen messages' / tools' strings in private-use markers,
render the template to text, then encode piece by piece (marked tokens as plain text, the rest
normally). When no string contains a special token, the ids equal the plain ``tokenize=True``
path.

Thread safety: every encode goes through one of two private copies of the tokenizer's backend
whose settings are fixed at creation and never written again (a shared fast tokenizer's
special-token setting is mutable state). Details: docs/design/episodes.md.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

START, END = "\U000f0000", "\U000f0001"
ALL_ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})
TEMPLATE_ARGS = frozenset({"conversation", "messages", "tools", "documents", "chat_template",
                            "add_generation_prompt", "continue_final_message", "tokenize",
                            "padding", "truncation", "max_length", "return_tensors",
                            "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


def control_tokens(tokenizer: Any) -> frozenset[str]:
    """The tokenizer's special tokens: named ones (eos, pad, additional specials) and added
    tokens flagged special. Non-special added tokens (``<think>``) are not among them."""
    tokens = set(tokenizer.all_special_tokens)
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    tokens.update(t.content for t in decoder.values() if getattr(t, "special", False))
    return frozenset(t for t in tokens if t)


@dataclass(frozen=True)
class _Encoders:
    """Per tokenizer: the control-token pattern and two private backends (normal, and with
    special tokens encoded as text). Built once, read-only afterwards."""

    pattern: re.Pattern[str]
    plain: Any
    as_text: Any
    newline_ids: tuple[int, ...]

    def encode(self, text: str, as_text: bool = False) -> list[int]:
        backend = self.as_text if as_text else self.plain
        return list(backend.encode(text, add_special_tokens=False).ids)


_CACHE: weakref.WeakKeyDictionary[Any, _Encoders] = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def _private_backend(tokenizer: Any, split_special: bool) -> Any:
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = split_special
    return backend


def encoders(tokenizer: Any) -> _Encoders:
    """The tokenizer's private encoders (created on first use, then shared read-only)."""
    with _CACHE_LOCK:
        hit = _CACHE.get(tokenizer)
        if hit is None:
            if getattr(tokenizer, "backend_tokenizer", None) is None:
                raise TypeError("chat templating needs a fast (Rust-backed) tokenizer")
            longest_first = sorted(control_tokens(tokenizer), key=len, reverse=True)
            plain = _private_backend(tokenizer, split_special=False)
            hit = _Encoders(
                pattern=re.compile("|".join(map(re.escape, longest_first)) or "(?!)"),
                plain=plain, as_text=_private_backend(tokenizer, split_special=True),
                newline_ids=tuple(plain.encode("\n", add_special_tokens=False).ids))
            _CACHE[tokenizer] = hit
        return hit


def warm(tokenizer: Any) -> None:
    """Build the private encoders at start-up (copying a 150k-token backend takes a moment
    that the first chat request should not pay on the event loop)."""
    if getattr(tokenizer, "backend_tokenizer", None) is not None:
        encoders(tokenizer)


def mark(obj: Any, pattern: re.Pattern[str]) -> Any:
    """Wrap control tokens in every string of ``obj`` (recursively; dict keys untouched)."""
    if isinstance(obj, str):
        obj = obj.replace(START, "").replace(END, "")  # markers cannot be forged either
        return pattern.sub(f"{START}\\g<0>{END}", obj)
    if isinstance(obj, dict):
        return {k: mark(v, pattern) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [mark(v, pattern) for v in obj]
    return obj


def _encode_piece(enc: _Encoders, piece: str, as_text: bool) -> list[int]:
    """Encode a piece from the middle of a chat; ``as_text``: special tokens as plain text.
    Encoded after a newline (then removed) so SentencePiece adds no prefix space."""
    ids = enc.encode("\n" + piece, as_text)
    n = len(enc.newline_ids)
    if tuple(ids[:n]) == enc.newline_ids:
        return ids[n:]
    return enc.encode(piece, as_text)


def encode_marked(tokenizer: Any, text: str, middle: bool = False) -> list[int]:
    """Token ids of a chat rendered from marked inputs (see the module docstring).
    ``middle``: ``text`` continues a chat (no SentencePiece prefix space at its start)."""
    enc = encoders(tokenizer)
    markers = re.compile(f"{START}({enc.pattern.pattern}){END}|[{START}{END}]")
    pieces = markers.split(text)  # [text, marked token | None, text, ...]
    ids = _encode_piece(enc, pieces[0], False) if middle and pieces[0] else enc.encode(pieces[0])
    for i, piece in enumerate(pieces[1:], start=1):
        if not piece:
            continue
        as_text = i % 2 == 1
        piece_ids = _encode_piece(enc, piece, as_text)
        if as_text and tokenizer.convert_tokens_to_ids(piece) in piece_ids:
            raise ValueError(f"cannot sanitize {piece!r}: the tokenizer makes it from text")
        ids += piece_ids
    return ids


def check_template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``chat_template_kwargs`` as the template's extra variables; the names that
    ``apply_chat_template`` itself takes are refused (ValueError)."""
    kwargs = dict(kwargs or {})
    clash = sorted(set(kwargs) & TEMPLATE_ARGS)
    if clash:
        raise ValueError(f"chat_template_kwargs may not set {clash}: the server sets them")
    return kwargs


def chat_text(tokenizer: Any, messages: list[dict[str, Any]],
              tools: list[dict[str, Any]] | None, *,
              sanitize_roles: Collection[str] = ALL_ROLES, sanitize_tools: bool = True,
              template_kwargs: dict[str, Any] | None = None,
              add_generation_prompt: bool = True) -> str:
    """The template's rendering of a chat as marked text (``encode_marked`` encodes it): the
    special tokens inside the messages of ``sanitize_roles`` (and the tools, if
    ``sanitize_tools``) wrapped in markers."""
    enc = encoders(tokenizer)
    msgs = [mark(m, enc.pattern) if m.get("role") in sanitize_roles else m for m in messages]
    text: str = tokenizer.apply_chat_template(
        msgs, tools=mark(tools, enc.pattern) if sanitize_tools else tools,
        add_generation_prompt=add_generation_prompt, tokenize=False,
        **check_template_kwargs(template_kwargs))
    return text


def chat_ids(tokenizer: Any, messages: list[dict[str, Any]],
             tools: list[dict[str, Any]] | None, *, sanitize_roles: Collection[str] = ALL_ROLES,
             sanitize_tools: bool = True,
             template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """``apply_chat_template(..., add_generation_prompt=True, tokenize=True)`` with the
    special tokens inside the messages of ``sanitize_roles`` (and the tools, if
    ``sanitize_tools``) encoded as text. Thread-safe (see the module docstring)."""
    return encode_marked(tokenizer, chat_text(
        tokenizer, messages, tools, sanitize_roles=sanitize_roles,
        sanitize_tools=sanitize_tools, template_kwargs=template_kwargs))
