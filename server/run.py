"""A dead engine is visible and ends the server, so that its supervisor restarts it.

An engine can die under a running server: vLLM's engine core process crashes or is killed
(every request after gets ``EngineDeadError``), or the hf engine's scheduler thread fails.
Nothing in the server can bring it back, and a server that answers 503 to everything while
its process lives on is never restarted. So, for every engine (``Engine.dead_reason``):

- ``watch_engine`` (a lifespan task) polls the engine every ``CHECK_INTERVAL_S``; once it is
  dead it logs the reason at CRITICAL, marks the app (``app.state.engine_dead``: ``/health``
  answers 503 ``"status": "dead"`` with the reason, ``/metrics`` has ``gspo_engine_dead 1``),
  sets ``app.state.exit_code`` to ``ENGINE_DEAD_EXIT_CODE`` and, after
  ``settings.engine_dead_exit_delay_s`` (health probes and a last scrape see the state; new
  requests get 503s meanwhile), asks the HTTP server to stop.
- ``run_server`` binds its port before the lifespan loads the model (uvicorn binds after):
  a port that is taken fails at once, not after minutes of loading, and no other process
  (vLLM's engine picks ports for itself while it starts) can take it meanwhile.
- The stop is uvicorn's graceful shutdown: no new connections, the requests in flight are
  answered (with errors: the engine is dead) within the graceful timeout, the lifespan shuts
  the engine and Redis down, and ``run_server`` returns the exit code, which ``gspo serve``
  exits with (non-zero: compose's ``restart: on-failure`` restarts it).

An app run some other way (tests, an embedding program) has no ``stop_server`` hook: it is
still marked dead and logged, and its runner decides what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

from fastapi import FastAPI

from gspo_rl.server.engines.sampler import SamplingEngine

log = logging.getLogger(__name__)
CHECK_INTERVAL_S = 0.5
ENGINE_DEAD_EXIT_CODE = 4
STARTUP_FAILURE_EXIT_CODE = 3  # uvicorn's own (``uvicorn.run``)


async def watch_engine(app: FastAPI, engine: SamplingEngine, exit_delay_s: float,
                       interval_s: float = CHECK_INTERVAL_S) -> None:
    """Wait until ``engine`` is dead, then make it visible and, ``exit_delay_s`` later, stop
    the server."""
    while (reason := engine.dead_reason()) is None:
        await asyncio.sleep(interval_s)
    app.state.engine_dead = reason
    app.state.exit_code = ENGINE_DEAD_EXIT_CODE
    log.critical("ENGINE DEAD (%s engine, model %s): %s. This server cannot generate any "
                 "more: /health answers 503, requests in flight are answered with errors; "
                 "in %.1f s the process exits with status %d so that its supervisor restarts "
                 "it.", engine.name, engine.model_path, reason, exit_delay_s,
                 ENGINE_DEAD_EXIT_CODE)
    await asyncio.sleep(exit_delay_s)
    stop = getattr(app.state, "stop_server", None)
    if stop is not None:
        stop()


def bind_port(host: str, port: int) -> socket.socket:
    """A TCP socket bound (not yet listening) to ``host:port``, as uvicorn would bind it."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def run_server(app: FastAPI, **uvicorn_config: Any) -> int:
    """``uvicorn.run(app, ...)`` that can be stopped from inside; returns the process's exit
    status: 0 after a normal shutdown, ``ENGINE_DEAD_EXIT_CODE`` when the engine died, 3 (as
    uvicorn) when the app failed to start or its port could not be bound."""
    import uvicorn

    config = uvicorn.Config(app, **uvicorn_config)
    try:
        sock = bind_port(config.host, config.port)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", config.host, config.port, exc)
        return STARTUP_FAILURE_EXIT_CODE
    server = _server_class()(config)

    def stop() -> None:
        server.should_exit = True

    app.state.stop_server = stop
    with sock, contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run
        server.run(sockets=[sock])
    if app.state.exit_code:
        return int(app.state.exit_code)
    return 0 if server.started else STARTUP_FAILURE_EXIT_CODE  # start-up failed: uvicorn logged it


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, which says where it listens once started from given sockets too
        (uvicorn says it only for the sockets it binds itself)."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if sockets is not None and self.started:
                self._log_started_message(sockets)

    return Server
