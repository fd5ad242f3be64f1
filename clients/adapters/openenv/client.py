"""The environment server's side: its URL, its ``/schema`` (over HTTP) and its sessions (over
openenv-core's WebSocket client).

``server_url`` and ``fetch_schema`` refuse, with a ``ValueError`` that says what to do, a target
that is no server URL and a server that cannot be reached or serves no OpenEnv schema.
``client_class()`` is openenv-core's ``GenericEnvClient`` (imported only here, on first use;
``AdapterUnavailable`` without the ``openenv`` extra) with every error reply of the server
raised as ``EnvServerError`` carrying openenv's ``WSErrorCode`` (``CAPACITY``, ``INVALID``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from typing import Any
from urllib.parse import urlsplit

import httpx

from gspo_rl.client.adapters import missing

SCHEMES = ("http://", "https://", "ws://", "wss://")
CAPACITY, INVALID = "CAPACITY_REACHED", "VALIDATION_ERROR"  # openenv's WSErrorCode values
CLOSE_WAIT_S = 5.0


class EnvServerError(RuntimeError):
    """An error reply of the environment server; ``code``: openenv's ``WSErrorCode``."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.code = str(data.get("code", "UNKNOWN"))
        errors = data.get("errors") or []
        self.detail = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}".lstrip(": ")
            for e in errors if isinstance(e, dict)) or str(data.get("message", "error"))
        super().__init__(f"{data.get('message', 'error')} (code: {self.code}): {self.detail}")


@functools.cache
def client_class() -> type:
    """openenv's dict client, its server errors raised as ``EnvServerError`` (with codes)."""
    try:
        from openenv.core.generic_client import GenericEnvClient
        from websockets.exceptions import ConnectionClosed
    except ImportError as exc:
        raise missing("openenv", exc) from exc

    class SessionClient(GenericEnvClient):  # type: ignore[misc]  # openenv ships no types
        async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
            with contextlib.suppress(ConnectionClosed):  # a refusal may close it: read it
                await self._send(message)
            response: dict[str, Any] = await self._receive()
            if response.get("type") == "error":
                raise EnvServerError(response.get("data") or {})
            return response

        async def disconnect(self) -> None:
            if self._ws is not None:  # let the server close: it fails to close a closed socket
                with contextlib.suppress(Exception):
                    await self._send({"type": "close"})
                    await asyncio.wait_for(self._ws.wait_closed(), CLOSE_WAIT_S)
            await super().disconnect()

    return SessionClient


def server_url(target: str) -> str:
    """The server's base URL from the spec's target; ValueError for anything else."""
    if "@" in target and not target.startswith(SCHEMES):
        raise ValueError(f"openenv: {target!r}: typed clients (module:Class@URL) are not "
                         "needed: the adapter speaks openenv's JSON through GenericEnvClient "
                         "and reads the action schema from the server; pass the URL alone")
    parts = urlsplit(target)
    if not target.startswith(SCHEMES) or not parts.netloc:
        raise ValueError(f"openenv: {target!r} is not a server URL: start the environment "
                         "server (e.g. `uvicorn server.app:app --port 8001`, or its Docker "
                         "image) and pass openenv:http://HOST:PORT")
    return target.rstrip("/")


def fetch_schema(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The server's ``/schema`` (action, observation, state); ValueError when unreachable or
    not an OpenEnv server."""
    http = re.sub(r"^ws", "http", url)
    try:
        r = httpx.get(f"{http}/schema", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ValueError(f"openenv: cannot reach the environment server at {url} ({exc!r}): "
                         "is it running?") from None
    try:
        body = r.json() if r.status_code == 200 else None
    except ValueError:
        body = None
    if not isinstance(body, dict) or not all(isinstance(body.get(k), dict)
                                             for k in ("action", "observation")):
        raise ValueError(f"openenv: {http}/schema answered {r.status_code} "
                         f"{r.text[:200]!r}: not an OpenEnv environment server (those serve "
                         "their action and observation schemas there)")
    return body
