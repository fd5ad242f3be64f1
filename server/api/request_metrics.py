"""Every HTTP request counted by route template and status, and timed, into the server's
Prometheus metrics (``gspo_rl.server.metrics``)."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gspo_rl.server.metrics import ServerMetrics


class RequestMetricsMiddleware:
    """Counts every HTTP request by route template and status and times it (pure ASGI, so it
    adds microseconds, not a task per request as ``BaseHTTPMiddleware`` would)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            # Routing stores the matched route in the (shared) scope; unmatched: one label.
            name = getattr(route, "path", None) or "unmatched"
            if scope.get("gspo.client_disconnected"):
                status = 499  # client closed the request (gspo_rl.server.api.disconnect)
            self.metrics.requests.labels(name, scope.get("method", ""), str(status)).inc()
            self.metrics.latency.labels(name).observe(time.perf_counter() - start)
