"""Abort the work of a request whose client has gone away.

A sampling request can hold the engine for minutes (64 samples of 2,000 tokens); if its client
disconnects (a timeout, a killed environment) nobody will read the samples or post their
rewards, so the decoding is wasted and the group it would record only expires. This pure ASGI
middleware watches the connection once the request body has been read: on
``http.disconnect`` before the response has started, or while a streamed response
(``text/event-stream``, ``gspo_rl.server.api.streaming.sse``) is still being sent, it cancels the
request's task. The cancellation reaches the engine's ``generate`` / ``generate_stream`` (the hf
engine drops the rows before its next step, vLLM's ``AsyncLLM.generate`` aborts the request on
cancellation), and since rollouts are written to Redis only after generation (streamed: after
every sample ended, before the final chunks), nothing is recorded for the request.

Only the routes in ``paths`` are watched (the sampling routes): a reward post is short and must
finish once it has started (its write is atomic anyway). Cancelled requests are counted in
``gspo_requests_disconnected`` and labelled status 499 in the request metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, cast

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)
DISCONNECTED_KEY = "gspo.client_disconnected"
"""Set in the ASGI scope of a request cancelled because its client left."""


class CancelOnDisconnectMiddleware:
    """Cancels a watched request's handler when its client disconnects (module docstring)."""

    def __init__(self, app: ASGIApp, paths: tuple[str, ...],
                 on_disconnect: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.paths = paths
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        body_read = asyncio.Event()
        response_started = streaming = response_sent = False

        async def tracked_receive() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read.set()
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal response_started, streaming, response_sent
            if message["type"] == "http.response.body" and not message.get("more_body"):
                response_sent = True  # the server reports a disconnect after this: not one
            elif message["type"] == "http.response.start":
                response_started = True
                streaming = any(k.lower() == b"content-type"
                                and v.startswith(b"text/event-stream")
                                for k, v in message.get("headers", ()))
            await send(message)

        handler = asyncio.create_task(cast(  # (an async app: its call is a coroutine)
            "Coroutine[Any, Any, None]", self.app(scope, tracked_receive, tracked_send)))

        async def watch() -> None:
            await body_read.wait()
            # The handler does not read again once the body is in: the next message the
            # server delivers is the disconnect (or nothing until the response is done).
            message = await receive()
            if message["type"] == "http.disconnect" and not response_sent and (
                    streaming or not response_started):
                scope[DISCONNECTED_KEY] = True
                log.info("client left %s before its response: its generation is aborted",
                         scope["path"])
                if self.on_disconnect is not None:
                    self.on_disconnect(scope["path"])
                handler.cancel()

        watcher = asyncio.create_task(watch())
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(handler)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            if not handler.done():  # this middleware itself was cancelled (server shutdown)
                handler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await handler
        if handler.cancelled() and not scope.get(DISCONNECTED_KEY):
            raise asyncio.CancelledError  # cancelled from outside: let it propagate
