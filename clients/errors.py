"""Exceptions of the SDK, named by what happened, as ``openai-python``'s ``_exceptions.py``.

Every error carries ``status`` (the HTTP status; 0 when the server was never reached),
``code`` (the server's short error code, e.g. ``"history_mismatch"``; None when there is
none), ``message`` (the server's human message) and ``body`` (the parsed response).

    GSPOError
    ├── ServerUnavailable             unreachable, or 5xx after every retry
    │   └── InternalServerError       a 5xx response (also an APIStatusError)
    └── APIStatusError                any non-2xx response
        └── RequestRejected           a 4xx: retrying the same request will not help
            ├── BadRequestError 400, AuthenticationError 401, PermissionDeniedError 403,
            │   RequestTooLargeError 413, UnprocessableEntityError 422, RateLimitError 429
            ├── NotFoundError 404 (alias NotFound)
            ├── ConflictError 409 (alias RewardConflict): RewardAlreadySet,
            │   HistoryMismatch, EpisodeSettingsChanged, ConcurrentTurn, EpisodeFinished
            └── GroupExpired 410      the group expired or was finalised

Each subclass's codes: docs/reference/sdk.md.
"""

from __future__ import annotations

from typing import Any


class GSPOError(Exception):
    """Base class of every SDK error."""

    def __init__(self, message: str, status: int = 0, body: Any = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.body = body
        self.code = code


class ServerUnavailable(GSPOError):
    """The server could not be reached or answered 5xx after every retry."""


class APIStatusError(GSPOError):
    """The server answered with a non-2xx status; ``status`` and ``code`` say which error.
    ``str(exc)`` is ``"HTTP <status>: <message>"``; ``message`` is the server's message."""

    def __init__(self, message: str, status: int = 0, body: Any = None,
                 code: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}", status=status, body=body, code=code)
        self.message = message

    @property
    def status_code(self) -> int:
        """openai-python's spelling of ``status``."""
        return self.status


class InternalServerError(APIStatusError, ServerUnavailable):
    """A 5xx response."""


class RequestRejected(APIStatusError):
    """A 4xx: the request itself is wrong (bad input, limits, auth). Retrying will not help."""


class BadRequestError(RequestRejected):
    """400: malformed request (bad JSON, an unsupported parameter, an empty prompt, ...)."""


class AuthenticationError(RequestRejected):
    """401: missing or wrong API key."""


class PermissionDeniedError(RequestRejected):
    """403: the key is valid but not allowed here (e.g. an admin route)."""


class NotFoundError(RequestRejected):
    """404: unknown rollout, group, episode or model."""


class ConflictError(RequestRejected):
    """409: the request conflicts with what the server has stored; ``code`` says how."""


class RewardAlreadySet(ConflictError):
    """409 ``conflict``: the rollout already has a different reward (rewards are write-once)."""


class HistoryMismatch(ConflictError):
    """409 ``history_mismatch`` / ``history_rewritten``: the messages of a turn do not extend
    the episode's recorded history."""


class EpisodeSettingsChanged(ConflictError):
    """409: a turn changed what is fixed per episode (tools, temperature, sampling)."""


class ConcurrentTurn(ConflictError):
    """409 ``concurrent_turn``: another turn of the episode was recorded meanwhile."""


class EpisodeFinished(ConflictError):
    """409 ``episode_finished``: the episode has its reward and takes no more turns."""


class GroupExpired(RequestRejected):
    """410: the group expired (or was finalised) before this request arrived."""


class RequestTooLargeError(RequestRejected):
    """413: the body is larger than the server accepts."""


class UnprocessableEntityError(RequestRejected):
    """422: well-formed JSON that fails validation (the message names the field)."""


class RateLimitError(RequestRejected):
    """429: too many requests or a full queue."""


# The old names: environment code written against them keeps catching the same errors.
NotFound = NotFoundError
RewardConflict = ConflictError

_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError,
    404: NotFoundError, 409: ConflictError, 410: GroupExpired, 413: RequestTooLargeError,
    422: UnprocessableEntityError, 429: RateLimitError,
}

_CONFLICT_BY_CODE: dict[str, type[ConflictError]] = {
    "conflict": RewardAlreadySet,
    "history_mismatch": HistoryMismatch,
    "history_rewritten": HistoryMismatch,
    "tools_changed": EpisodeSettingsChanged,
    "temperature_changed": EpisodeSettingsChanged,
    "sampling_changed": EpisodeSettingsChanged,
    "concurrent_turn": ConcurrentTurn,
    "episode_finished": EpisodeFinished,
}


def _message_and_code(body: Any) -> tuple[str, str | None]:
    """The server's ``{"error": {"message", "code"}}``, or the body as text."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = err.get("code")
        return str(err.get("message", body)), str(code) if code is not None else None
    return str(body), None


def error_class(status: int, code: str | None) -> type[APIStatusError]:
    """The exception class for a response's status and the server's error code."""
    if status == 409 and code in _CONFLICT_BY_CODE:
        return _CONFLICT_BY_CODE[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return RequestRejected if 400 <= status < 500 else InternalServerError


def error_for_status(status: int, body: Any) -> APIStatusError:
    """The exception for a non-2xx response; ``body`` is the parsed JSON (or text)."""
    message, code = _message_and_code(body)
    return error_class(status, code)(message, status=status, body=body, code=code)
