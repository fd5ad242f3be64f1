"""Tool-call parsers per model family (vLLM's ``--tool-call-parser`` names): text -> (content,
calls). The rule of all of them: every call must parse, or the whole text stays content (the
environment sees what the model wrote, never a silently repaired call).

- ``hermes`` (Qwen2.5, Qwen3, Hermes): ``<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>`` blocks anywhere in the text
  (``gspo_rl.server.rollouts.chat.render.parse_tool_calls``).
- ``llama3_json`` (Llama 3.1 / 3.2 / 3.3): the whole message is one JSON object
  ``{"name": ..., "parameters": {...}}`` (or several joined by ``;``), optionally after
  ``<|python_tag|>``; a message that does not start so is content.
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}`` (or, newer
  tokenizers, ``name[ARGS]{...}`` / ``name{...}`` pieces, each after its own marker); text
  before the marker is content.
- ``qwen3_coder`` (Qwen3-Coder): ``<tool_call><function=NAME><parameter=KEY>value</parameter>
  </function></tool_call>``; values are text, converted by the tool's JSON schema (integer,
  number, boolean, object, array), else kept as strings.
- ``none``: no parsing.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any, get_args

from gspo_rl.server.config import ToolParserName
from gspo_rl.server.rollouts.chat.render import ParsedToolCall, parse_tool_calls

TOOL_PARSERS: tuple[str, ...] = get_args(ToolParserName)
Parsed = tuple[str | None, list[ParsedToolCall]]
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TAG = "[TOOL_CALLS]"
_DECODER = json.JSONDecoder()


def make_call(name: Any, args: Any) -> ParsedToolCall | None:
    """A call from a name and arguments (an object, or a JSON string of one); None if bad."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        return None
    return ParsedToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=name,
                          arguments=json.dumps(args, ensure_ascii=False))


def _json_objects(text: str, sep: str) -> list[Any] | None:
    """Consecutive JSON values separated by ``sep`` (and whitespace); None if anything else."""
    values, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        try:
            value, i = _DECODER.raw_decode(text, i)
        except ValueError:
            return None
        values.append(value)
        rest = text[i:].lstrip()
        if not rest:
            return values
        if not rest.startswith(sep):
            return None
        i = len(text) - len(rest) + len(sep)


def parse_hermes(text: str, tools: list[dict[str, Any]] | None = None) -> Parsed:
    return parse_tool_calls(text)


def parse_llama3_json(text: str, tools: list[dict[str, Any]] | None = None) -> Parsed:
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):]
    if not body.lstrip().startswith("{"):
        return text, []
    objs = _json_objects(body, ";")
    calls = []
    for obj in objs or [None]:
        if not isinstance(obj, dict):
            return text, []
        call = make_call(obj.get("name"), obj.get("parameters", obj.get("arguments", {})))
        if call is None:
            return text, []
        calls.append(call)
    return None, calls


def _mistral_piece(piece: str) -> list[ParsedToolCall] | None:
    piece = piece.strip()
    if piece.startswith("["):  # the JSON-list form
        try:
            objs, end = _DECODER.raw_decode(piece)
        except ValueError:
            return None
        if piece[end:].strip() or not isinstance(objs, list) or not objs:
            return None
        calls = [make_call(o.get("name"), o.get("arguments", {})) if isinstance(o, dict)
                 else None for o in objs]
        return None if None in calls else calls  # type: ignore[return-value]  # no None in it: checked
    name, sep, args = piece.partition("[ARGS]")
    if not sep:  # name{...}
        brace = piece.find("{")
        name, args = (piece[:brace], piece[brace:]) if brace > 0 else ("", "")
    call = make_call(name.strip(), args.strip())
    return None if call is None else [call]


def parse_mistral(text: str, tools: list[dict[str, Any]] | None = None) -> Parsed:
    if MISTRAL_TAG not in text:
        return text, []
    head, *pieces = text.split(MISTRAL_TAG)
    calls: list[ParsedToolCall] = []
    for piece in pieces:
        got = _mistral_piece(piece)
        if got is None:
            return text, []
        calls += got
    return (head.strip() or None), calls


_QC_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*</tool_call>",
                      re.DOTALL)
_QC_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _schema_types(tools: list[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    for tool in tools or []:
        fn = tool.get("function") or {}
        if fn.get("name") == name:
            return ((fn.get("parameters") or {}).get("properties")) or {}
    return {}


def convert_value(raw: str, schema: Any) -> Any:
    """A Qwen3-Coder parameter value (text) as its schema's type; text when it is not one."""
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind in (None, "string"):
        return value
    if value.strip().lower() == "null":
        return None
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            number = float(value)
            return int(number) if number.is_integer() and "." not in value else number
        if kind == "boolean":
            if value.lower() in ("true", "false"):
                return value.lower() == "true"
            return value
        return json.loads(value)  # object, array, or a union of types
    except ValueError:
        return value


def parse_qwen3_coder(text: str, tools: list[dict[str, Any]] | None = None) -> Parsed:
    if "<tool_call>" not in text:
        return text, []
    blocks = list(_QC_CALL.finditer(text))
    rest = _QC_CALL.sub("", text)
    if not blocks or "<tool_call>" in rest:
        return text, []
    calls = []
    for block in blocks:
        name = block.group(1).strip()
        types = _schema_types(tools, name)
        args = {k.strip(): convert_value(v, types.get(k.strip()))
                for k, v in _QC_PARAM.findall(block.group(2))}
        call = make_call(name, args)
        if call is None:
            return text, []
        calls.append(call)
    return (text[:blocks[0].start()].strip() or None), calls


def parse_none(text: str, tools: list[dict[str, Any]] | None = None) -> Parsed:
    return text, []


PARSERS: dict[str, Callable[[str, list[dict[str, Any]] | None], Parsed]] = {
    "hermes": parse_hermes, "llama3_json": parse_llama3_json, "mistral": parse_mistral,
    "qwen3_coder": parse_qwen3_coder, "none": parse_none}


def parse_calls(text: str, parser: str, tools: list[dict[str, Any]] | None = None) -> Parsed:
    """(content, tool calls) of ``text`` by the named parser."""
    return PARSERS[parser](text, tools)
