"""Serve the real rollout server app under real uvicorn, on a free port, for tests.

``serve_app(app)`` runs ``uvicorn.Server`` in a daemon thread (its own event loop, lifespan
on), waits for ``/health`` to answer 200, fails fast if the server thread dies during start-up
(e.g. the lifespan raised), and always shuts it down: graceful exit, then a forced one.
``RedisKeys`` snapshots what a test may have written to Redis, to assert "nothing recorded".
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
import uvicorn
from fastapi import FastAPI

from gspo_rl.contract.schema import Keys
from tests.conftest import free_port

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


@dataclass
class Served:
    """A running app: where to reach it, and the app (for its state)."""

    url: str
    app: FastAPI

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"


def _wait_healthy(url: str, thread: threading.Thread, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise RuntimeError(f"the server exited during start-up (last /health: {last})")
        try:
            r = httpx.get(f"{url}/health", timeout=2.0)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.TransportError as exc:
            last = repr(exc)
        time.sleep(0.05)
    raise TimeoutError(f"/health not 200 within {timeout}s (last: {last})")


@contextlib.contextmanager
def serve_app(app: FastAPI, timeout: float = START_TIMEOUT_S,
              port: int | None = None) -> Iterator[Served]:
    """Runs ``app`` under uvicorn on 127.0.0.1:<port or a free one> until the block exits."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    exit_codes: list[object] = []

    def run() -> None:
        try:
            server.run()
        except SystemExit as exc:  # uvicorn exits this way when the lifespan fails
            exit_codes.append(exc.code)

    thread = threading.Thread(target=run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            _wait_healthy(url, thread, timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; uvicorn exit code {exit_codes}") from None
        yield Served(url=url, app=app)
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            server.force_exit = True
            thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            raise RuntimeError(f"uvicorn on port {port} did not stop")


class RedisKeys:
    """The rollout/group keys and counters under a prefix, minus the server registry (which
    the heartbeat refreshes on its own): equal snapshots mean nothing was recorded."""

    def __init__(self, url: str, keys: Keys) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=5)
        self.keys = keys

    def snapshot(self) -> tuple[frozenset[bytes], dict[bytes, bytes]]:
        registry = (self.keys.servers.encode(), f"{self.keys.prefix}:server:".encode(),
                    f"{self.keys.prefix}:admission:".encode())  # refreshed every second
        names = frozenset(k for k in self.client.scan_iter(f"{self.keys.prefix}:*", count=1000)
                          if not k.startswith(registry))
        return names, self.client.hgetall(self.keys.counters)

    def get(self, key: str) -> bytes | None:
        return self.client.get(key)

    def close(self) -> None:
        self.client.close()


API_KEY = "test-api-key"
ADMIN_KEY = "test-admin-key"
MODEL_NAME = "tiny"


@contextlib.contextmanager
def running_server(model_dir: Path, redis_url: str, **overrides: Any) -> Iterator[Served]:
    """The real app (hf engine on ``model_dir``) served on a free port. Defaults: both keys
    set, small limits (max_n 8, max_tokens 64) so the limit checks are cheap to reach, and
    admission control off (no learner runs: the API tests leave many groups open, which
    would count as in flight; tests/server/rollouts/test_admission.py turns it on)."""
    from gspo_rl.server.api.app import create_app
    from gspo_rl.server.config import ServerSettings

    fields: dict[str, Any] = dict(
        model=str(model_dir), redis_url=redis_url, served_model_name=MODEL_NAME,
        api_key=API_KEY, admin_key=ADMIN_KEY, max_n=8, max_tokens=64, max_batch_size=16,
        max_body_bytes=64 * 1024, device="cpu", server_id="test-server", admission=False)
    fields.update(overrides)
    # One port for both: the server advertises it to the learner through the registry.
    fields.setdefault("port", free_port())
    with serve_app(create_app(ServerSettings(**fields)), port=fields["port"]) as served:
        yield served
