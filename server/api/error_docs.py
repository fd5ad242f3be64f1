"""The error statuses each route can answer, for the OpenAPI document (``responses=``).

Every error body is ``{"error": {"message", "type", "code", "details"?}}``
(``gspo_rl.server.api.errors``); ``ErrorResponse`` is that shape as a schema, so a client generated
from the document (or a fuzzer checking responses against it) knows what a 4xx/503 looks like.
FastAPI's default 422 schema (``{"detail": [...]}``) is replaced by it too: the server never answers
that shape.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    """What went wrong, for a person."""
    type: str
    """OpenAI-style class: invalid_request_error, authentication_error, not_found_error, ..."""
    code: str | None = None
    """Short machine-readable reason (``invalid_value``, ``ready_queue_full``, ...)."""
    details: Any = None
    """Per-field validation errors (422) or per-item results (rewards)."""


class ErrorResponse(BaseModel):
    error: ErrorDetail


_WHY = {
    400: "Invalid request: malformed JSON, a body nested too deep or holding invalid text, or "
         "a value over one of this server's limits",
    401: "Missing or invalid key (Authorization: Bearer <key>)",
    403: "Admin routes are disabled (an API key but no admin key is configured)",
    404: "Unknown model, rollout or group",
    409: "Conflict with stored state (a different reward, an episode's history or settings)",
    410: "The group expired or was finalised",
    413: "Request body larger than max_body_bytes",
    422: "A field is missing or has a wrong type or value (details lists each field)",
    501: "Not supported by this server's configuration",
    503: "Redis unreachable or out of memory, the engine unavailable, the ready queue or the "
         "groups in flight at their bound, or the learner finished training (a new group "
         "only): nothing was stored; retry after Retry-After",
    504: "The weight transfer timed out",
}

V1_POST = (400, 401, 413, 422, 503)
"""What every ``/v1`` POST route can answer: bad JSON, key, size, validation, Redis."""


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route that can answer ``statuses`` (sorted, deduplicated)."""
    return {s: {"model": ErrorResponse, "description": _WHY[s]} for s in sorted(set(statuses))}
