"""The SDK's one retry policy (``gspo_rl.client.client._after_attempt``), driven by both clients
against a real HTTP server that answers 503 a set number of times before 200."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gspo_rl.client.client import AsyncGSPOClient, GSPOClient, RetryPolicy
from gspo_rl.client.errors import ServerUnavailable

FAST = RetryPolicy(attempts=3, base_delay_s=0.001, max_delay_s=0.002)


class _Flaky(BaseHTTPRequestHandler):
    failures_left = 0
    calls = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        cls = type(self)
        cls.calls += 1
        status, body = (503, {"error": {"message": "busy", "code": "busy"}})
        if cls.failures_left > 0:
            cls.failures_left -= 1
        else:
            status, body = 200, {"status": "ok"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _set(failures: int) -> None:
    _Flaky.failures_left, _Flaky.calls = failures, 0


@pytest.mark.parametrize("failures", [0, 2])
def test_both_clients_retry_503_until_success(flaky: str, failures: int) -> None:
    _set(failures)
    with GSPOClient(flaky, retry=FAST, timeout_s=10) as c:
        assert c.health() == {"status": "ok"}
    assert _Flaky.calls == failures + 1

    async def run() -> dict:
        async with AsyncGSPOClient(flaky, retry=FAST, timeout_s=10) as c:
            return await c.health()

    _set(failures)
    assert asyncio.run(run()) == {"status": "ok"}
    assert _Flaky.calls == failures + 1


def test_both_clients_give_up_after_the_policy_attempts(flaky: str) -> None:
    _set(10)
    with GSPOClient(flaky, retry=FAST, timeout_s=10) as c, pytest.raises(ServerUnavailable):
        c.health()
    assert _Flaky.calls == FAST.attempts

    async def run() -> None:
        async with AsyncGSPOClient(flaky, retry=FAST, timeout_s=10) as c:
            await c.health()

    _set(10)
    with pytest.raises(ServerUnavailable):
        asyncio.run(run())
    assert _Flaky.calls == FAST.attempts
