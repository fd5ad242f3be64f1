"""The SDK's one retry policy (``gspo_rl.client.retry.after_attempt``), driven by both clients
against a real HTTP server that answers 503 a set number of times before 200."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import gspo_rl.client.retry as retry_module
from gspo_rl.client.client import AsyncGSPOClient, GSPOClient, RetryPolicy
from gspo_rl.client.errors import ServerUnavailable
from gspo_rl.client.retry import Throttle
from gspo_rl.contract.net import free_port

FAST = RetryPolicy(attempts=3, base_delay_s=0.001, max_delay_s=0.002)


class _JSONHandler(BaseHTTPRequestHandler):
    """Answers with JSON; logs nothing."""

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


class _Flaky(_JSONHandler):
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
        self.reply(status, body)


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


class _Rewards(_JSONHandler):
    posts = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        type(self).posts += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        self.reply(200, {"results": [], "stored": 1, "duplicates": 0})


def test_a_reward_post_rides_out_a_server_restart(caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewards are idempotent: while nothing listens (a server restarting), the post is tried
    again past ``attempts``, saying so, and lands once a server answers. A request that is not
    patient (sampling) gives up after ``attempts`` as before."""
    monkeypatch.setattr(retry_module, "OUTAGE_SAID", Throttle())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    policy = RetryPolicy(attempts=2, base_delay_s=0.05, max_delay_s=0.1, outage_patience_s=60)
    with GSPOClient(url, retry=policy, timeout_s=5) as c, pytest.raises(ServerUnavailable):
        c.rollouts(prompt="a", n=1)
    servers: list[ThreadingHTTPServer] = []

    def start_later() -> None:
        time.sleep(1.5)
        servers.append(ThreadingHTTPServer(("127.0.0.1", port), _Rewards))
        servers[0].serve_forever()

    threading.Thread(target=start_later, daemon=True).start()
    try:
        with caplog.at_level(logging.WARNING, logger="gspo_rl.client.client"), \
                GSPOClient(url, retry=policy, timeout_s=5) as c:
            assert c.post_reward("r1", 1.0)["stored"] == 1
        assert _Rewards.posts == 1
        said = [r.getMessage() for r in caplog.records]
        assert any("POST /v1/rewards" in m and "has not answered" in m for m in said), said
    finally:
        if servers:
            servers[0].shutdown()
            servers[0].server_close()


def test_a_reward_post_gives_up_after_its_outage_patience() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    policy = RetryPolicy(attempts=1, base_delay_s=0.05, max_delay_s=0.1, outage_patience_s=0.5)

    async def run() -> None:
        async with AsyncGSPOClient(url, retry=policy, timeout_s=5) as c:
            await c.post_reward("r1", 1.0)

    t0 = time.monotonic()
    with pytest.raises(ServerUnavailable, match="POST /v1/rewards"):
        asyncio.run(run())
    assert time.monotonic() - t0 < 30  # bounded: it did not retry forever
