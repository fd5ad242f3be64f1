"""``run_server`` holds its port from the start: while the lifespan loads the model no other
process can bind it, and a port that is taken fails at once, before any model loads."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from gspo_rl.server.run import STARTUP_FAILURE_EXIT_CODE, run_server
from tests.conftest import free_port

pytestmark = pytest.mark.timeout(60)


def slow_start_app(loading: threading.Event, release: threading.Event) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading.set()
        while not release.is_set():  # "loading the model"
            await asyncio.sleep(0.02)
        yield

    app = FastAPI(lifespan=lifespan)
    app.state.exit_code = None

    @app.get("/ping")
    def ping() -> dict[str, str]:
        return {"pong": "yes"}

    return app


def test_the_port_is_held_while_the_model_loads(capfd: pytest.CaptureFixture[str]) -> None:
    loading, release = threading.Event(), threading.Event()
    app, port = slow_start_app(loading, release), free_port()
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(
        run_server(app, host="127.0.0.1", port=port, log_level="info")))
    thread.start()
    try:
        assert loading.wait(20)
        with socket.socket() as other, pytest.raises(OSError):  # a port picked meanwhile
            other.bind(("127.0.0.1", port))
        with socket.socket() as other:  # nor does the kernel hand it out for port 0
            other.bind(("127.0.0.1", 0))
            assert other.getsockname()[1] != port
        release.set()
        for _ in range(200):
            with contextlib.suppress(httpx.TransportError):
                assert httpx.get(f"http://127.0.0.1:{port}/ping", timeout=5).json() == {
                    "pong": "yes"}
                break
            threading.Event().wait(0.05)
        else:
            pytest.fail("the server never answered")
    finally:
        release.set()
        app.state.stop_server()
        thread.join(20)
    assert codes == [0]
    # uvicorn says where it listens (to stderr) also when it was handed the socket
    assert f"Uvicorn running on http://127.0.0.1:{port}" in capfd.readouterr().err


def test_a_taken_port_fails_before_the_model_loads(caplog: pytest.LogCaptureFixture) -> None:
    loading, release = threading.Event(), threading.Event()
    app = slow_start_app(loading, release)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        threading.Timer(5, release.set).start()  # a server that loads first ends anyway
        code = run_server(app, host="127.0.0.1", port=port, log_level="info")
    assert code == STARTUP_FAILURE_EXIT_CODE
    assert not loading.is_set()
    assert f"cannot listen on 127.0.0.1:{port}" in caplog.text
