"""The parent's end of one scoring worker: ``Worker``, its process and its pipe.

``boot`` starts the process, sends it the scorer's pickled factory and returns its first word
(run in a daemon thread through ``io``: a large payload blocks until the worker reads it);
``call`` sends one call's arguments and returns the reply as a future that the event loop
reads when the pipe is readable; ``kill`` stops the process (SIGKILL, or SIGTERM first) and
closes the pipe once no thread reads it; ``exit_note`` says how the process ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing.process
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, cast


class Worker:
    """One worker process and the parent's end of its pipe, read by the event loop (``call``)
    or by one daemon thread at a time (``io``: the start; the pipe is closed only once no
    thread reads it)."""

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Connection) -> None:
        self.process, self.conn = process, conn
        self._lock = threading.Lock()
        self._reading = self._dead = False
        self._watch: tuple[asyncio.AbstractEventLoop, int] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def io(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """``fn(*args)`` in a daemon thread (it never holds up the interpreter's exit), as a
        future of the running loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if not fut.done():
                fut.set_result(value) if ok else fut.set_exception(value)

        def run() -> None:
            try:
                value, ok = fn(*args), True
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting call
                value, ok = exc, False
            with self._lock:
                self._reading = False
                if self._dead:
                    self.conn.close()
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle, ok, value)

        with self._lock:
            self._reading = True
        threading.Thread(target=run, name="gspo-scoring-io", daemon=True).start()
        return fut

    def boot(self, child: Connection, payload: bytes) -> tuple[Any, ...]:
        """Start the process, send it the scorer's factory, wait for its first word (in a
        thread: a large payload blocks until the worker reads it)."""
        with self._lock:
            try:
                if self._dead:
                    raise EOFError("stopped before it started")
                self.process.start()
            finally:
                child.close()  # the worker's end: only the worker holds it (EOF when it dies)
        self.conn.send_bytes(payload)
        return cast("tuple[Any, ...]", self.conn.recv())  # (the worker's replies are tuples)

    def roundtrip(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        self.conn.send(args)
        return cast("tuple[Any, ...]", self.conn.recv())  # (the worker's replies are tuples)

    def call(self, args: tuple[Any, ...]) -> asyncio.Future[Any]:
        """Send one call; its reply as a future, read by the loop when the pipe is readable
        (no thread; a loop without ``add_reader`` gets a thread, ``io``)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        fd = self.conn.fileno()

        def readable() -> None:
            self.unwatch()
            if not fut.done():
                try:
                    fut.set_result(self.conn.recv())
                except Exception as exc:  # noqa: BLE001 - EOF: the worker died
                    fut.set_exception(exc)

        try:
            loop.add_reader(fd, readable)
        except NotImplementedError:  # Windows' proactor loop
            return self.io(self.roundtrip, args)
        self._watch = (loop, fd)
        try:
            self.conn.send(args)  # an idle worker is reading: a large message drains at once
        except BaseException:
            self.unwatch()
            raise
        return fut

    def unwatch(self) -> None:
        if self._watch is not None:
            loop, fd = self._watch
            self._watch = None
            with contextlib.suppress(Exception):  # a closed loop watches nothing
                loop.remove_reader(fd)

    def kill(self, graceful: bool = False) -> None:
        """Stop the process (SIGTERM first when ``graceful``, else SIGKILL at once)."""
        self.unwatch()
        with self._lock:
            self._dead = True  # a boot not yet begun will not start the process
        if self.process.pid is not None:
            if graceful:
                self.process.terminate()
                self.process.join(1.0)
            self.process.kill()
            self.process.join(5.0)
        with self._lock:
            if not self._reading:
                self.conn.close()

    def exit_note(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"
