"""Exceptions of the SDK: one per thing an environment may want to handle differently."""

from __future__ import annotations

from typing import Any


class GSPOError(Exception):
    """Base class. ``status`` is the HTTP status (0 when the server was never reached)."""

    def __init__(self, message: str, status: int = 0, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class ServerUnavailable(GSPOError):
    """The server could not be reached or answered 5xx after every retry."""


class RequestRejected(GSPOError):
    """A 4xx: the request itself is wrong (bad input, limits, auth). Retrying will not help."""


class NotFound(RequestRejected):
    """404: unknown rollout or group."""


class RewardConflict(RequestRejected):
    """409: the rollout already has a different reward (rewards are write-once)."""


class GroupExpired(RequestRejected):
    """410: the group expired before its rewards arrived."""


def error_for_status(status: int, body: Any) -> GSPOError:
    """The exception for a non-2xx response; ``body`` is the parsed JSON (or text)."""
    message = str(body)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = str(body["error"].get("message", message))
    cls: type[GSPOError] = {404: NotFound, 409: RewardConflict, 410: GroupExpired}.get(
        status, RequestRejected if 400 <= status < 500 else ServerUnavailable)
    return cls(f"HTTP {status}: {message}", status=status, body=body)
