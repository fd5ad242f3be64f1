"""Bounds every request body must meet before the server does any work for it.

Hostile input found in the field (issue 11) and what each check here prevents:

- ``check_request_json`` (a dependency of every ``/v1`` route, after the API key): the parsed
  JSON body may nest at most ``MAX_JSON_DEPTH`` levels and every string (keys included) must
  be valid Unicode text. JSON's ``\\ud800`` escape decodes to a lone surrogate, which the
  tokenizer, msgpack and the response encoder all refuse with a ``TypeError`` /
  ``UnicodeEncodeError`` (a 500); deep nesting overflows the template, msgpack and the JSON
  encoder of a later ``GET`` (a 500 on every read). 400 ``invalid_string`` / ``too_deep``.
- ``Metadata`` (the type of every ``metadata`` field): metadata is stored in Redis and handed
  to the learner, so it must survive msgpack: at most ``MAX_METADATA_BYTES`` packed,
  ``MAX_METADATA_DEPTH`` levels, integers in int64, finite floats only (a NaN reaching the
  learner poisons whatever uses it). 422 with the field's path.
- ``check_group_size``: ``POST /v1/groups`` is refused before a single id is built (a size of
  ``2**64`` used to build its id list first). 422, like a size under 1.
- ``check_chat_messages``: system, developer, user and tool messages need ``content`` (a chat
  template indexes it: a ``TypeError`` inside the template, a 500).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Annotated, Any

import msgpack
from fastapi import Request
from pydantic import AfterValidator

from gspo_rl.server.api.errors import APIError

MAX_JSON_DEPTH = 64
"""Deepest nesting of a request body (tool parameter schemas need a dozen levels at most)."""
MAX_METADATA_DEPTH = 16
MAX_METADATA_BYTES = 64 * 1024
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
CONTENT_REQUIRED = ("system", "developer", "user", "tool")


def _bad_string(s: str) -> bool:
    """True for a string UTF-8 cannot encode (a lone surrogate from a ``\\udXXX`` escape)."""
    if s.isascii():
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _children(value: Any) -> Sequence[Any] | None:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, list):
        return value
    return None


_CONTAINERS = (dict, list)
_WALKED = (dict, list, str)
# A lone surrogate reaches a parsed body only through a \uD800-\uDFFF escape or raw
# surrogate bytes (json.loads decodes bytes with "surrogatepass"); both are cheap to spot.
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_RAW_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")


def _maybe_surrogate(raw: bytes) -> bool:
    """Could the parsed body hold a lone surrogate? (``in`` first: a plain substring search
    runs at memory speed, the regexes only where the substring occurs.)"""
    return ((b"\\u" in raw and _ESCAPED_SURROGATE.search(raw) is not None)
            or (b"\xed" in raw and _RAW_SURROGATE.search(raw) is not None))


def json_problem(value: Any, max_depth: int, check_strings: bool = True) -> str | None:
    """Why ``value`` (parsed JSON) is refused: too deep or a string that is not valid text;
    None when it is fine. Iterative, so a deep value cannot overflow the stack here; scalars
    other than strings are skipped at C speed (a body can hold a million token ids)."""
    walked = _WALKED if check_strings else _CONTAINERS
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if v.__class__ is str:
            if _bad_string(v):
                return f"a string is not valid UTF-8 text (lone surrogate): {ascii(v[:40])}"
            continue
        if v.__class__ not in _CONTAINERS:
            continue
        kids = _children(v) if check_strings else (
            list(v.values()) if v.__class__ is dict else v)
        if depth > max_depth:
            return f"nested deeper than {max_depth} levels"
        stack.extend([(k, depth + 1) for k in kids if k.__class__ in walked])
    return None


async def parsed_body(request: Request) -> Any:
    """The request's JSON body (parsed once, cached on the request); None when it is not JSON
    or too deep for the parser: FastAPI's own body parsing answers those (400/422)."""
    try:
        return await request.json()
    except (ValueError, RecursionError):
        return None


async def check_request_json(request: Request) -> None:
    """Dependency: 400 for a JSON body that nests too deep or holds invalid text. Runs after
    the body is parsed (FastAPI caches it on the request) and before the body's validation.
    The raw bytes decide first whether a walk is needed at all."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    raw = await request.body()
    check_strings = _maybe_surrogate(raw)
    if not check_strings and raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return
    body = await parsed_body(request)
    problem = json_problem(body, MAX_JSON_DEPTH, check_strings)
    if problem is None:
        return
    code = "too_deep" if problem.startswith("nested") else "invalid_string"
    raise APIError(400, f"request body: {problem}", code=code)


def _metadata_problem(value: Any, depth: int) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if INT64_MIN <= value <= INT64_MAX else f"integer {value} is outside int64"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"number {value} is not finite"
    if isinstance(value, str):
        return "a string is not valid UTF-8 text" if _bad_string(value) else None
    kids = _children(value)
    if kids is None:
        return f"unsupported value of type {type(value).__name__}"
    if depth > MAX_METADATA_DEPTH:
        return f"nested deeper than {MAX_METADATA_DEPTH} levels"
    for k in kids:
        problem = _metadata_problem(k, depth + 1)
        if problem:
            return problem
    return None


def check_metadata(value: dict[str, Any]) -> dict[str, Any]:
    """Pydantic after-validator of ``Metadata``: JSON values msgpack stores and the learner
    reads back unchanged, within the size bound. Raises ``ValueError`` (a 422)."""
    json_ok = json_problem(value, MAX_METADATA_DEPTH)  # bounds the recursion below
    problem = json_ok or _metadata_problem(value, 1)
    if problem:
        raise ValueError(f"metadata: {problem}")
    size = len(msgpack.packb(value))
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is {size} bytes packed, over the limit of "
                         f"{MAX_METADATA_BYTES}")
    return value


Metadata = Annotated[dict[str, Any], AfterValidator(check_metadata)]


def check_group_size(size: int, max_group_size: int) -> None:
    """``POST /v1/groups``: a size over the queue's ``max_group_size`` is a 422 (like a size
    of 0), answered before any id is built."""
    if size > max_group_size:
        raise APIError(422, f"size {size} is over this server's max_group_size of "
                            f"{max_group_size}", code="group_too_large")


def check_chat_messages(messages: Sequence[Any]) -> None:
    """400 for a message whose role needs ``content`` but has none (``ChatMessage`` objects)."""
    for i, m in enumerate(messages):
        if m.role in CONTENT_REQUIRED and m.content is None:
            raise APIError(400, f"messages[{i}] ({m.role}) has no content: {m.role} messages "
                                "need it (use \"\" for an empty one)", code="missing_content")
