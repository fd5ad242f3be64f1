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

from gspo_rl.server.engines.base import Completion
from gspo_rl.server.rollouts.chat.sanitize import ALL_ROLES, chat_ids, check_template_kwargs
from gspo_rl.server.rollouts.errors import invalid

T = TypeVar("T")
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOL_CALL_OPEN = "<tool_call>"
# Chat turns end at these tokens when the tokenizer has them (Qwen: <|im_end|>), besides EOS.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>")


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


def _content_text(content: Any) -> str | None:
    """OpenAI content: a string, None, or a list of parts of which only text is supported."""
    if content is None or isinstance(content, str):
        return content
    texts = []
    for part in content:
        part_type = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        if part_type != "text" or text is None:
            raise invalid(f"unsupported content part type {part_type!r}: this server "
                          "serves a text model, send parts of type 'text'",
                          code="unsupported_content")
        texts.append(text)
    return "".join(texts)


def _template_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """An assistant tool call as templates expect it: ``arguments`` as an object when the
    wire string is a JSON object (Qwen-style templates ``tojson`` it; a string would be
    encoded twice), otherwise unchanged."""
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            fn["arguments"] = parsed
    return {**call, "function": fn}


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages (as dicts) -> the dicts chat templates read."""
    out = []
    for m in messages:
        content = _content_text(m.get("content"))
        if content is None and m["role"] == "assistant":
            # OpenAI sends null content beside tool calls; real templates (Qwen3's) call
            # string methods on it.
            content = ""
        msg: dict[str, Any] = {"role": "system" if m["role"] == "developer" else m["role"],
                               "content": content}
        for key in ("name", "tool_call_id", "reasoning_content"):
            if m.get(key) is not None:
                msg[key] = m[key]
        if m.get("tool_calls"):
            msg["tool_calls"] = [_template_tool_call(c) for c in m["tool_calls"]]
        out.append(msg)
    return out


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
    forge a turn boundary (``gspo_rl.server.rollouts.chat.sanitize``; non-special added tokens such
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


def end_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """EOS and end-of-turn ids: where an assistant turn (or a completion) ends. End-of-turn
    markers are always added tokens: looking them up there avoids building the whole
    vocabulary dict (150k entries for Qwen) on every request."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    added = tokenizer.get_added_vocab()
    ids.update(added[t] for t in END_OF_TURN_TOKENS if t in added)
    return tuple(sorted(ids))


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
