"""Text <-> tokens for the HTTP API: chat templating, tool-call parsing, token texts.

The engines see token ids only; everything textual happens here, once, so both engines sample
from exactly the same prompt tokens and the recorded trajectory is the one the model saw.

Tool calls follow the Qwen / Hermes convention the chat template teaches the model::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A completion whose every ``<tool_call>`` block parses becomes OpenAI ``tool_calls`` (and the
blocks leave ``content``); if any block is malformed the whole text stays ``content``, so the
environment sees what the model wrote rather than a silently repaired call.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

from jinja2 import TemplateError

from gspo_rl.contract.chat.messages import ContentError
from gspo_rl.contract.chat.messages import template_messages as _template_messages
from gspo_rl.contract.chat.sanitize import ALL_ROLES, chat_ids, check_template_kwargs
from gspo_rl.server.engines.sampler import Completion
from gspo_rl.server.rollouts.errors import invalid

T = TypeVar("T")
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOL_CALL_OPEN = "<tool_call>"


INLINE_CHARS = 16_384
"""Inputs shorter than this are templated / tokenised on the event loop: a worker-thread hop
costs more than the work (beside an engine thread that holds the GIL, several hand-offs);
longer ones move off the loop, so one huge prompt cannot stall every other request."""


def approx_chars(value: Any) -> int:
    """Characters in every string of a JSON-like value (the size of templating work)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(approx_chars(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(approx_chars(v) for v in value)
    return 0


async def off_loop_if_large(n_chars: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` inline when the input is small, else in a worker thread."""
    if n_chars < INLINE_CHARS:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


@dataclass(frozen=True)
class ParsedToolCall:
    """One tool call in OpenAI wire form: ``arguments`` is a JSON string."""

    id: str
    name: str
    arguments: str


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages (as dicts) -> the dicts chat templates read
    (``gspo_rl.contract.chat.messages``); a non-text content part is a 400."""
    try:
        return _template_messages(messages)
    except ContentError as exc:
        raise invalid(str(exc), code="unsupported_content") from exc


def render_chat_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    sanitize_control_tokens: bool = True,
    *,
    text_roles: Collection[str] = (),
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Prompt token ids of a chat: the template with its generation prompt, tokenised as
    ``apply_chat_template(..., tokenize=True)`` does. With ``sanitize_control_tokens``, a
    special token inside a message or tool definition is encoded as text, so a user cannot
    forge a turn boundary (``gspo_rl.contract.chat.sanitize``; non-special added tokens such
    as ``<think>`` stay tokens). ``text_roles``: roles sanitized even when that is off (episodes:
    the assistant's own earlier messages, whose rendering only has to keep turn boundaries
    countable). ``template_kwargs``: extra template variables (``enable_thinking``...)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise invalid("this model's tokenizer has no chat template: use /v1/completions",
                      code="no_chat_template")
    msgs = template_messages(messages)
    try:
        kwargs = check_template_kwargs(template_kwargs)
    except ValueError as exc:
        raise invalid(str(exc), code="invalid_parameter") from exc
    roles = ALL_ROLES if sanitize_control_tokens else frozenset(text_roles)
    try:
        ids = chat_ids(tokenizer, msgs, tools or None, sanitize_roles=roles,
                       sanitize_tools=sanitize_control_tokens, template_kwargs=kwargs)
    except TemplateError as exc:  # e.g. the template's raise_exception on a bad role order
        raise invalid(f"the chat template rejected the messages: {exc}",
                      code="invalid_messages") from exc
    except ValueError as exc:  # a control token the tokenizer cannot keep as text
        raise invalid(f"cannot render the messages: {exc}",
                      code="control_token_in_content") from exc
    return [int(t) for t in ids]


def parse_tool_calls(text: str) -> tuple[str | None, list[ParsedToolCall]]:
    """Split ``text`` into (content, tool calls). No calls, or any malformed: (text, [])."""
    if TOOL_CALL_OPEN not in text:
        return text, []
    blocks = TOOL_CALL_RE.findall(text)
    rest = TOOL_CALL_RE.sub("", text)
    if not blocks or TOOL_CALL_OPEN in rest:  # an unclosed block: the model was cut off
        return text, []
    calls = []
    for block in blocks:
        try:
            obj = json.loads(block)
        except ValueError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models emit the arguments already encoded
            try:
                args = json.loads(args)
            except ValueError:
                return text, []
        if not isinstance(args, dict):
            return text, []
        calls.append(ParsedToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=obj["name"],
                                    arguments=json.dumps(args, ensure_ascii=False)))
    content = rest.strip()
    return (content or None), calls


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-character table used by byte-level BPE vocabularies."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


_BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}


class TokenTexts:
    """Per-token text and bytes for log-probability responses, cached per token id.

    Byte-level BPE vocabularies store each token as printable stand-ins for raw bytes; mapping
    them back gives the exact bytes even when a token holds half of a UTF-8 character.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, bytes]] = {}

    def get(self, token_id: int) -> tuple[str, bytes]:
        hit = self._cache.get(token_id)
        if hit is None:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece and all(c in _BYTE_DECODER for c in piece):
                raw = bytes(_BYTE_DECODER[c] for c in piece)
                hit = (raw.decode("utf-8", errors="replace"), raw)
            else:
                text = self.tokenizer.decode([token_id])
                hit = (text, text.encode("utf-8"))
            self._cache[token_id] = hit
        return hit

    def text(self, token_id: int) -> str:
        return self.get(token_id)[0]


def sequence_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """``tokenizer.decode(ids, skip_special_tokens=False)`` for one list of ids. For a fast
    tokenizer with transformers' own ``decode`` and ``_decode`` and no clean-up of spaces,
    that call comes down to the Rust decoder's: it is called straight away, without the
    per-id walk (``to_py_obj``) and keyword handling around it (~40 us of a 128-token
    completion, with the GIL held)."""
    def slow(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return slow
    cls = type(tokenizer)
    if (cls.decode is not PreTrainedTokenizerBase.decode
            or getattr(cls, "_decode", None) is not TokenizersBackend._decode
            or getattr(tokenizer, "clean_up_tokenization_spaces", True) is not False):
        return slow
    rust = tokenizer._tokenizer

    def fast(ids: list[int]) -> str:
        return rust.decode(ids, skip_special_tokens=False)

    return fast


def completion_text(tokenizer: Any, completion: Completion, stop_ids: tuple[int, ...],
                    decode: Callable[[list[int]], str] | None = None) -> str:
    """The completion as text, OpenAI style: without the end-of-turn token that stopped it and
    cut before the stop string that stopped it (the token ids keep everything sampled).
    ``decode``: ``sequence_decoder(tokenizer)`` when the caller holds it."""
    ids = completion.token_ids
    if completion.finish_reason == "stop" and ids and ids[-1] in stop_ids:
        ids = ids[:-1]
    text = (decode or sequence_decoder(tokenizer))(ids)
    if completion.stop_string:
        cut = text.find(completion.stop_string)
        if cut >= 0:
            text = text[:cut]
    return text
