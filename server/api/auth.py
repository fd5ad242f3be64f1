"""The two keys that guard the routes, checked before a request's body is read.

Two keys, two roles: ``api_key`` lets environments sample and post rewards (every path under
``/v1``); ``admin_key`` lets the learner replace the weights (``/admin``). ``/health``,
``/metrics`` and the OpenAPI pages are open. Keys are compared in constant time. With no
``admin_key`` configured, admin routes are open only when the API key is unset too (a local
single-user setup); otherwise they are closed (403), never open to holders of the API key.

``BearerAuthMiddleware`` is a pure ASGI middleware: it reads the path and the ``Authorization``
header and answers a refused request (401 with ``WWW-Authenticate: Bearer``, or 403) in the
JSON error shape without receiving a byte of its body, so a request without the key costs the
server no parse (FastAPI reads and parses a body before any dependency runs).
The route dependencies (``gspo_rl.server.api.deps``) run the same check again through
``HTTPBearer``, which also puts the security scheme in the OpenAPI document.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Literal

from pydantic import SecretStr
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from gspo_rl.server.api.errors import APIError
from gspo_rl.server.config import ServerSettings

Guard = Literal["api", "admin"]
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def guard_of(path: str) -> Guard | None:
    """Which key a path needs: "api" under ``/v1``, "admin" under ``/admin``, else None."""
    for prefix, guard in (("/v1", "api"), ("/admin", "admin")):
        if path == prefix or path.startswith(prefix + "/"):
            return guard  # type: ignore[return-value]  # one of the two literals above
    return None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive, as
    ``HTTPBearer`` reads it); None for a missing header or another scheme."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    return token.strip() or None


def _compare(token: str | None, key: SecretStr, what: str) -> APIError | None:
    if token is None:
        return APIError(401, f"missing {what}: send the header 'Authorization: Bearer <key>'",
                        code="missing_api_key", headers=_CHALLENGE)
    if not secrets.compare_digest(token.encode(), key.get_secret_value().encode()):
        return APIError(401, f"invalid {what}", code="invalid_api_key", headers=_CHALLENGE)
    return None


def key_error(settings: ServerSettings, guard: Guard, token: str | None) -> APIError | None:
    """Why a request to a route behind ``guard`` with ``token`` is refused; None: let in."""
    if guard == "api":
        return None if settings.api_key is None else _compare(token, settings.api_key,
                                                              "API key")
    if settings.admin_key is not None:
        return _compare(token, settings.admin_key, "admin key")
    if settings.api_key is not None:
        return APIError(403, "admin routes are disabled: this server has an API key but no "
                             "admin key (set GSPO_ADMIN_KEY / --admin-key)",
                        code="admin_disabled")
    return None


class BearerAuthMiddleware:
    """Refuses requests without the key their path needs before their body is received.
    ``routes``: the app's, to name the route a refused request was for (in ``scope``, as
    routing would: the request metrics count it by its route, not as unmatched)."""

    def __init__(self, app: ASGIApp, settings: ServerSettings,
                 routes: Sequence[BaseRoute] = ()) -> None:
        self.app = app
        self.settings = settings
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            guard = guard_of(scope["path"])
            if guard is not None:
                header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
                token = bearer_token(header.decode("latin-1") if header is not None else None)
                error = key_error(self.settings, guard, token)
                if error is not None:
                    self._name_route(scope)
                    await error.response()(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    def _name_route(self, scope: Scope) -> None:
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE:
                scope["route"] = route
                return
