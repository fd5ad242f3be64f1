"""The check every request body must pass before the server does any work for it
(``check_request_json``, a dependency of every ``/v1`` route, after the API key): the parsed
JSON may nest at most ``MAX_JSON_DEPTH`` levels and every string (keys included) must be valid
Unicode text, else 400 ``too_deep`` / ``invalid_string``. The bounds on what a body carries
(metadata, group size, chat messages) are the rollout layer's (``gspo_rl.server.rollouts.limits``);
docs/api.md says what each check prevents."""

from __future__ import annotations

import re
from typing import Any

from fastapi import Request

from gspo_rl.server.api.errors import APIError
from gspo_rl.server.rollouts.limits import json_problem

MAX_JSON_DEPTH = 64
"""Deepest nesting of a request body (tool parameter schemas need a dozen levels at most)."""

# A lone surrogate reaches a parsed body only through a \uD800-\uDFFF escape or raw
# surrogate bytes (json.loads decodes bytes with "surrogatepass"); both are cheap to spot.
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_RAW_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")


def _maybe_surrogate(raw: bytes) -> bool:
    """Could the parsed body hold a lone surrogate? (``in`` first: a plain substring search
    runs at memory speed, the regexes only where the substring occurs.)"""
    return ((b"\\u" in raw and _ESCAPED_SURROGATE.search(raw) is not None)
            or (b"\xed" in raw and _RAW_SURROGATE.search(raw) is not None))


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
