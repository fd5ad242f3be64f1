"""One JSON error shape for every failure of the HTTP API, OpenAI style.

Every 4xx/5xx body is ``{"error": {"message": ..., "type": ..., "code": ...}}`` (plus optional
``details``), so clients (the official ``openai`` client included) can parse any failure the
same way. ``install_error_handlers(app)`` renders:

- ``APIError`` raised by a route or a dependency, as is;
- ``RolloutError`` (the rollout layer's refusals, ``gspo_rl.server.rollouts.errors``) with the
  status its problem maps to here;
- ``StoreError`` (the Redis layer's refusals, ``gspo_rl.contract.errors``) with the status its
  reason maps to here: this module is the one place a storage outcome becomes an HTTP status;
- ``EngineError`` (an engine's typed failures, ``gspo_rl.server.engines.errors``) with the status
  its type maps to here (``ENGINE_STATUS``);
- request validation errors as 422 with the field path in the message, except malformed
  JSON, which is a 400 (the body is not JSON at all, nothing to validate);
- bodies larger than ``max_body_bytes`` as 413, checked on ``Content-Length`` and while the
  body streams in (a chunked upload cannot bypass it);
- Starlette's own HTTP errors (unknown route 404, wrong method 405);
- Redis being unreachable as 503 (the client should retry; nothing was stored), and Redis
  out of memory (``maxmemory`` reached, writes refused) as 503 too: retryable, so the SDK
  (which retries 502/503/504) keeps the reward instead of dropping it on a 500;
- anything else as a 500 without internals.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gspo_rl.contract.errors import StoreError, StoreReason
from gspo_rl.server.engines.errors import (
    EngineError,
    EngineUnavailable,
    InvalidWeights,
    RequestRefused,
    WeightSyncFailed,
)
from gspo_rl.server.rollouts.errors import Problem, RolloutError

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    410: "gone_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


STORE_STATUS = {
    StoreReason.NOT_FOUND: 404,
    StoreReason.CONFLICT: 409,
    StoreReason.GONE: 410,
    StoreReason.INVALID: 422,
    StoreReason.UNAVAILABLE: 503,
}
"""HTTP status of each reason the store refuses a request for."""

ROLLOUT_STATUS = {
    Problem.INVALID: 400,
    Problem.NOT_FOUND: 404,
    Problem.CONFLICT: 409,
    Problem.UNPROCESSABLE: 422,
    Problem.UNSUPPORTED: 501,
    Problem.UNAVAILABLE: 503,
}
"""HTTP status of each problem the rollout layer refuses a request for."""

ENGINE_STATUS: dict[type[EngineError], tuple[int, str | None, str | None]] = {
    RequestRefused: (400, None, "invalid_request"),
    EngineUnavailable: (503, None, "engine_unavailable"),
    InvalidWeights: (400, None, "invalid_weights"),
    WeightSyncFailed: (504, "weight_sync_error", None),
}
"""HTTP status, error type (None: the status's) and code of each engine failure."""


def store_status(exc: StoreError) -> int:
    return STORE_STATUS[exc.reason]


class APIError(StarletteHTTPException):
    """An error with a status, a human message, an OpenAI-style ``type`` and a short ``code``.

    A subclass of Starlette's ``HTTPException`` so that it propagates unchanged through
    FastAPI's body reading (which re-raises ``HTTPException`` and wraps everything else).
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str | None = None,
        code: str | None = None,
        details: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(status_code=status, detail=message, headers=headers)
        self.status = status
        self.message = message
        self.type = type or _TYPE_BY_STATUS.get(status, "api_error")
        self.code = code
        self.details = details

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"message": self.message, "type": self.type, "code": self.code}
        if self.details is not None:
            err["details"] = self.details
        return {"error": err}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def store_api_error(exc: StoreError) -> APIError:
    """The ``APIError`` a store refusal renders as."""
    return APIError(store_status(exc), exc.message, code=exc.code, details=exc.details)


def rollout_api_error(exc: RolloutError) -> APIError:
    """The ``APIError`` a refusal of the rollout layer renders as."""
    headers = None if exc.retry_after_s is None else {"Retry-After": str(exc.retry_after_s)}
    return APIError(ROLLOUT_STATUS[exc.problem], exc.message, code=exc.code,
                    details=exc.details, headers=headers)


def engine_api_error(exc: EngineError) -> APIError:
    """The ``APIError`` an engine's typed failure renders as (its nearest type in
    ``ENGINE_STATUS``; a 500 for a type not listed)."""
    for klass in type(exc).__mro__:
        if klass in ENGINE_STATUS:
            status, kind, code = ENGINE_STATUS[klass]
            return APIError(status, str(exc), type=kind, code=code)
    return APIError(500, "internal server error", code="internal_error")


def error_response(status: int, message: str, code: str | None = None) -> JSONResponse:
    return APIError(status, message, code=code).response()


def _loc_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """``("body", "items", 3, "reward")`` -> ``body.items[3].reward``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "request"


def validation_error_response(exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        e = errors[0]
        detail = (e.get("ctx") or {}).get("error", "")
        pos = e.get("loc", ("body", "?"))[-1]
        return error_response(400, f"malformed JSON body at position {pos}: {detail}",
                              "invalid_json")
    parts = [f"{_loc_path(e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors[:10]]
    if len(errors) > 10:
        parts.append(f"... and {len(errors) - 10} more")
    details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")}
               for e in errors[:100]]
    return APIError(422, "; ".join(parts), code="invalid_value", details=details).response()


class BodySizeLimitMiddleware:
    """Answers 413 to bodies over ``max_bytes``: on ``Content-Length`` before reading, else
    while the body streams in (raised as an ``APIError`` from ``receive``)."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._too_large().response()(scope, receive, send)
                    return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self._too_large()
            return message

        await self.app(scope, limited_receive, send)

    def _too_large(self) -> APIError:
        return APIError(413, f"request body larger than {self.max_bytes} bytes",
                        code="body_too_large")


async def _api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response()


async def _rollout_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RolloutError)
    return rollout_api_error(exc).response()


async def _engine_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EngineError)
    return engine_api_error(exc).response()


async def _store_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StoreError)
    return store_api_error(exc).response()


async def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_error_response(exc)


async def _http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}"
    headers = exc.headers
    if exc.status_code == 405:  # Starlette names only the first route of the path
        headers = {**(headers or {}), "Allow": _allowed_methods(request)}
    return APIError(exc.status_code, message, headers=headers).response()


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at the request's path (routes may share a path)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match != Match.NONE and getattr(route, "methods", None):
            methods |= set(route.methods)
    return ", ".join(sorted(methods))


def _redis_down_error() -> APIError:
    return APIError(503, "the queue (Redis) is unavailable; nothing was stored, retry later",
                    code="redis_unavailable", headers={"Retry-After": "1"})


def _redis_oom_error() -> APIError:
    return APIError(503, "the queue (Redis) is out of memory and refuses writes; nothing was "
                         "stored, retry later", code="redis_out_of_memory",
                    headers={"Retry-After": "5"})


def api_error_of(exc: BaseException) -> APIError:
    """The ``APIError`` an exception renders as, as the handlers below render it (for a
    response that has already started: ``gspo_rl.server.api.streaming.group`` sends it as an SSE
    event)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RolloutError):
        return rollout_api_error(exc)
    if isinstance(exc, StoreError):
        return store_api_error(exc)
    if isinstance(exc, EngineError):
        return engine_api_error(exc)
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return _redis_oom_error()
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError
                  | redis.exceptions.BusyLoadingError):
        return _redis_down_error()
    return APIError(500, "internal server error", code="internal_error")


async def _redis_down_handler(request: Request, exc: Exception) -> JSONResponse:
    logger.warning("redis unavailable during %s %s: %s", request.method, request.url.path, exc)
    return _redis_down_error().response()


async def _redis_oom_handler(request: Request, exc: Exception) -> JSONResponse:
    logger.warning("redis refused a write (out of memory) during %s %s: %s", request.method,
                   request.url.path, exc)
    return _redis_oom_error().response()


async def _unexpected_handler(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error in %s %s", request.method, request.url.path)
    return error_response(500, "internal server error", "internal_error")


def install_error_handlers(app: FastAPI, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
    """Registers the handlers above and the body size limit on ``app`` (before it starts)."""
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_body_bytes)
    app.add_exception_handler(APIError, _api_error_handler)
    app.add_exception_handler(RolloutError, _rollout_error_handler)
    app.add_exception_handler(StoreError, _store_error_handler)
    app.add_exception_handler(EngineError, _engine_error_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    app.add_exception_handler(redis.exceptions.ConnectionError, _redis_down_handler)
    app.add_exception_handler(redis.exceptions.TimeoutError, _redis_down_handler)
    app.add_exception_handler(redis.exceptions.BusyLoadingError, _redis_down_handler)
    app.add_exception_handler(redis.exceptions.OutOfMemoryError, _redis_oom_handler)
    app.add_exception_handler(Exception, _unexpected_handler)
