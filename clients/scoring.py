"""Scoring off the event loop: worker processes that run a scoring function, with a time limit.

``ScoringPool(make_scorer, workers=N, timeout_s=T, preload=...)`` runs ``scorer(*args)`` in
one of at most ``N`` worker processes (``spawn``: safe beside threads and asyncio), in the
worker's main thread, where signal-based time limits (math-verify's) work. ``make_scorer``: a
picklable zero-argument callable run once per worker to build ``scorer``; ``preload``: modules
(names or ``.py`` files) each worker imports first. ``await pool.score(*args)``:

- returns what the scorer returned (it must pickle);
- past ``timeout_s``: kills the worker (SIGKILL), starts a replacement, raises
  ``ScoringTimeout``; a worker that dies: ``ScoringCrashed``, and a replacement;
- the scorer raised: ``ScoringError`` with its type, message and traceback text.

``score_many(calls)``: all at once; the first failure raises, calls not yet started never do.

Workers start lazily (a call that finds none free starts one while fewer than ``N`` run, else
waits; a long wait is logged). A call cancelled mid-score kills its worker (the late answer
would reach the next call). ``close()`` (idempotent; ``async with``) stops them all; a pool
pickles and copies as None. Workers are daemons: a scorer may run subprocesses, not
``multiprocessing`` children; a script must start its run under ``if __name__ == "__main__"``.

``ScoringPool.for_environment(env)`` runs ``env.scorer()`` (by default ``env.score``, which
pickles the whole environment); modules loaded from files (``gspo_env_*``,
``gspo_verifier_*``: ``gspo_rl.client.loading``) that it refers to are preloaded by file.
Guide: docs/environments/scoring.md.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import importlib
import importlib.util
import io
import logging
import math
import multiprocessing
import multiprocessing.process
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("gspo_rl.client.scoring")

FILE_MODULE_PREFIXES = ("gspo_env_", "gspo_verifier_")
"""Names under which ``gspo_rl.client`` loads modules from files: preloaded by file."""
START_TIMEOUT_S = 120.0
"""How long a worker may take to start (imports, unpickling the scorer)."""
WAIT_LOG_S = 5.0
"""A call that waits this long for a free worker logs it (at most once per 30 s)."""

PICKLE_ERRORS = (pickle.PicklingError, TypeError, AttributeError)
"""What pickling an object that does not pickle raises (a lock, a lambda, a local class)."""
Preload = tuple[str, str | None]  # (module name, file to load it from; None: import by name)


class ScoringError(Exception):
    """A scoring call failed: ``exc_type`` (the qualified name of the scorer's exception; ""
    for a timeout, a crash, a closed pool), ``message`` and ``traceback_text`` (the
    worker's)."""

    def __init__(self, exc_type: str, message: str, traceback_text: str = "") -> None:
        super().__init__(f"{exc_type}: {message}" if exc_type else message)
        self.exc_type, self.message, self.traceback_text = exc_type, message, traceback_text

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.exc_type, self.message, self.traceback_text)


class ScoringTimeout(ScoringError):
    """A call ran past the pool's ``timeout_s``: its worker was killed."""


class ScoringCrashed(ScoringError):
    """A worker died (or could not start) during a call."""


class _RemoteTraceback(Exception):
    """The worker's traceback, chained as ``__cause__`` so that it shows when raised."""

    def __str__(self) -> str:
        return f"\n{self.args[0]}" if self.args else ""


def _describe(exc: BaseException) -> tuple[str, str, str]:
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}")
    return name, str(exc), "".join(traceback.format_exception(exc))


def _import(name: str, path: str | None) -> None:
    if path is None:
        importlib.import_module(name)
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path} as {name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickle finds classes through sys.modules
    spec.loader.exec_module(module)


def _worker_main(conn: Connection, preload: Sequence[Preload]) -> None:
    """A worker: preload, build the scorer from the pickled factory sent first, then answer
    each call with ("ok", result) or ("error", type, message, traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        for name, path in preload:
            _import(name, path)
        scorer = pickle.loads(conn.recv_bytes())()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("init_error", *_describe(exc)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            args = conn.recv()
        except EOFError:
            return  # the parent is gone
        except Exception as exc:  # noqa: BLE001 - arguments that do not unpickle here
            conn.send(("error", *_describe(exc)))
            continue
        try:
            reply = ("ok", scorer(*args))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
            reply = ("error", *_describe(exc))
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - a result that does not pickle
            conn.send(("error", *_describe(exc)))


class _Pickler(pickle.Pickler):
    """Pickles, noting the module of every class, function and object it meets."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        try:
            module = getattr(obj, "__module__", None)
        except Exception:  # noqa: BLE001 - a proxy's __getattr__: it names no module
            module = None
        if isinstance(module, str):
            self.modules.add(module)
        return NotImplemented  # pickled the usual way


def pickled(obj: Any) -> tuple[bytes, set[str]]:
    """``obj`` pickled, and the modules its classes and functions come from."""
    buf = io.BytesIO()
    pickler = _Pickler(buf)
    pickler.dump(obj)
    return buf.getvalue(), pickler.modules


def _preload_entry(item: str) -> Preload:
    """A module name as is; a file as the name this process loaded it under (else
    ``gspo_env_<stem>``, as ``gspo_rl.client.loading`` names it)."""
    if not (item.endswith(".py") or "/" in item or "\\" in item):
        return item, None
    path = str(Path(item).expanduser().resolve())
    if not Path(path).is_file():
        raise ValueError(f"preload: no such file: {path}")
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == path:
            return name, path
    return f"gspo_env_{Path(path).stem}", path


def _file_modules(names: set[str]) -> list[Preload]:
    """The modules among ``names`` that were loaded from files (``FILE_MODULE_PREFIXES``):
    a fresh process cannot import them by name."""
    out = []
    for name in sorted(names):
        path = getattr(sys.modules.get(name), "__file__", None)
        if name.startswith(FILE_MODULE_PREFIXES) and path:
            out.append((name, path))
    return out


def _same(value: Any) -> Any:
    return value


class _Worker:
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
        return self.conn.recv()

    def roundtrip(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        self.conn.send(args)
        return self.conn.recv()

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


class HasScorer(Protocol):
    """A single-turn environment, as ``ScoringPool.for_environment`` sees it."""

    score_workers: int
    score_timeout_s: float

    def scorer(self) -> Callable[..., Any]: ...


class ScoringPool:
    """At most ``workers`` processes running one scorer (module docstring)."""

    def __init__(self, make_scorer: Callable[[], Callable[..., Any]], *, workers: int,
                 timeout_s: float, preload: Sequence[str] = (), name: str = "scoring") -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        try:
            self._payload, modules = pickled(make_scorer)
        except PICKLE_ERRORS as exc:
            raise TypeError(f"the scorer cannot be sent to worker processes: it does not "
                            f"pickle ({type(exc).__name__}: {exc})") from exc
        entries = [_preload_entry(p) for p in preload]
        named = {n for n, _ in entries}
        self._preload = entries + [e for e in _file_modules(modules) if e[0] not in named]
        self.workers, self.timeout_s, self.name = workers, timeout_s, name
        self._ctx = multiprocessing.get_context("spawn")
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._waiters: collections.deque[asyncio.Future[_Worker | None]] = collections.deque()
        self._live = 0  # workers running or starting
        self._tasks: set[asyncio.Task[None]] = set()
        self._broken: ScoringError | None = None
        self._closed = False
        self._wait_logged_at = -math.inf

    @classmethod
    def for_environment(cls, env: HasScorer, *, workers: int | None = None,
                        timeout_s: float | None = None) -> ScoringPool:
        """The pool that runs ``env.scorer()`` (``score_workers`` processes, each call limited
        to ``score_timeout_s``). TypeError naming why when it cannot be pickled."""
        workers = env.score_workers if workers is None else workers
        timeout_s = env.score_timeout_s if timeout_s is None else timeout_s
        name = type(env).__name__
        try:
            return cls(functools.partial(_same, env.scorer()), workers=workers,
                       timeout_s=timeout_s, name=name)
        except TypeError as exc:
            raise TypeError(
                f"{name} cannot score in worker processes (score_workers={workers}): {exc}. "
                "What scores must pickle: keep clients, locks, open files and lambdas off the "
                "environment (make them lazily), override scorer() to send less, or set "
                "score_workers = 0") from exc

    @property
    def closed(self) -> bool:
        return self._closed

    def __reduce__(self) -> tuple[Any, ...]:
        return type(None), ()  # processes do not travel: a copy has no pool

    async def __aenter__(self) -> ScoringPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def score(self, *args: Any) -> Any:
        """``scorer(*args)`` in a free worker (module docstring: its errors)."""
        return await self._score(args, None)

    async def score_many(self, calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``score(*args)`` for each ``args`` of ``calls``, all at once. The first failure
        raises; calls still waiting for a worker then never start, those running finish
        (their results dropped)."""
        failed = asyncio.Event()

        async def one(args: tuple[Any, ...]) -> Any:
            try:
                return await self._score(args, failed)
            except BaseException:
                failed.set()
                raise

        return list(await asyncio.gather(*(one(args) for args in calls)))

    async def _score(self, args: tuple[Any, ...], skip: asyncio.Event | None) -> Any:
        worker = await self._acquire()
        if skip is not None and skip.is_set():
            self._give(worker)
            raise ScoringError("", "not started: another call of its batch failed")
        try:
            reply = await asyncio.wait_for(worker.call(args), self.timeout_s)
        except TimeoutError:
            self._retire(worker)
            log.warning("%s: a scoring call ran past %gs: worker %s killed, another started",
                        self.name, self.timeout_s, worker.pid)
            raise ScoringTimeout("", f"no result within {self.timeout_s:g}s "
                                 f"(worker {worker.pid} killed)") from None
        except PICKLE_ERRORS as exc:  # whole messages or none: the pipe is still in step
            self._give(worker)
            raise ScoringError(type(exc).__name__, f"a call's arguments or result do not "
                               f"pickle: {exc}") from exc
        except (EOFError, OSError):
            worker.process.join(1.0)  # its own exit code, before a kill overwrites it
            err = self._crashed(worker)
            self._retire(worker)
            raise err from None
        except BaseException:  # cancelled: its late answer must not reach the next call
            self._retire(worker)
            raise
        return self._answer(worker, reply)

    def close(self) -> None:
        """Stop every worker (idempotent); calls waiting for one raise ``ScoringError``."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(RuntimeError):  # closed from outside its (ended) loop
            for task in self._tasks:
                task.cancel()
            for fut in self._waiters:
                if not fut.done():
                    fut.set_exception(ScoringError("", f"the {self.name} scoring pool is "
                                                   "closed"))
        self._waiters.clear()
        for worker in list(self._all):
            worker.kill(graceful=True)
        self._all.clear()
        self._idle.clear()

    def _answer(self, worker: _Worker, reply: tuple[Any, ...]) -> Any:
        self._give(worker)
        if reply[0] == "ok":
            return reply[1]
        err = ScoringError(*reply[1:])
        err.__cause__ = _RemoteTraceback(reply[3])
        raise err

    def _crashed(self, worker: _Worker) -> ScoringError:
        if self._closed:
            return ScoringError("", f"the {self.name} scoring pool is closed")
        log.warning("%s: scoring worker %s died (%s), another started", self.name, worker.pid,
                    worker.exit_note())
        return ScoringCrashed("", f"the scoring worker {worker.pid} died "
                              f"({worker.exit_note()})")

    async def _acquire(self) -> _Worker:
        self._check()
        if self._idle:
            return self._idle.pop()
        if self._live < self.workers:
            self._live += 1
            return await self._boot_reserved()
        got = await self._wait_turn()
        return got if got is not None else await self._boot_reserved()

    def _check(self) -> None:
        if self._closed:
            raise ScoringError("", f"the {self.name} scoring pool is closed")
        if self._broken is not None:
            raise ScoringError(self._broken.exc_type, self._broken.message,
                               self._broken.traceback_text)

    async def _wait_turn(self) -> _Worker | None:
        """Wait for a free worker, or (None) a freed slot to start one in."""
        fut: asyncio.Future[_Worker | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            done, _ = await asyncio.wait({fut}, timeout=WAIT_LOG_S)
            if not done:
                self._log_wait()
            return await fut
        except BaseException:
            self._forget(fut)
            raise

    def _forget(self, fut: asyncio.Future[_Worker | None]) -> None:
        """A waiting call gave up: pass on what it was handed, if anything."""
        if not fut.done():
            fut.cancel()
        with contextlib.suppress(ValueError):
            self._waiters.remove(fut)
        if fut.cancelled() or fut.exception() is not None:
            return
        got = fut.result()
        if got is None:
            self._live -= 1
        self._give(got)

    def _log_wait(self) -> None:
        now = time.monotonic()
        if now - self._wait_logged_at >= 30.0:
            self._wait_logged_at = now
            log.warning("%s: a scoring call waited over %gs for a free worker (all %d busy, %d "
                        "calls waiting): scoring is the bottleneck; raise score_workers",
                        self.name, WAIT_LOG_S, self.workers, len(self._waiters))

    def _give(self, worker: _Worker | None, replace: bool = False) -> None:
        """Hand a free worker (None: a freed slot) to the first waiting call; else keep the
        worker idle, or start a replacement in the slot when ``replace``."""
        if self._closed:
            if worker is not None:
                worker.kill(graceful=True)
                self._all.discard(worker)
            return
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                self._live += worker is None
                fut.set_result(worker)
                return
        if worker is not None:
            self._idle.append(worker)
        elif replace:
            self._live += 1
            task = asyncio.get_running_loop().create_task(self._replace())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _replace(self) -> None:
        try:
            worker = await self._boot_reserved()
        except Exception as exc:  # noqa: BLE001 - the next call that needs one tries again
            log.warning("%s: could not start a replacement scoring worker: %s", self.name, exc)
            return
        self._give(worker)

    def _retire(self, worker: _Worker) -> None:
        """Kill a worker whose call failed or was abandoned; start another in its place."""
        worker.kill()
        self._all.discard(worker)
        if not self._closed:
            self._live -= 1
            self._give(None, replace=True)

    async def _boot_reserved(self) -> _Worker:
        """Start a worker in a slot already counted in ``_live`` (freed again on failure)."""
        try:
            self._check()
            return await self._boot()
        except BaseException:
            self._live -= 1
            self._give(None)
            raise

    async def _boot(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker_main, args=(child, self._preload),
                                    name=f"gspo-scoring-{self.name}", daemon=True)
        worker = _Worker(process, parent)
        self._all.add(worker)
        t0 = time.monotonic()
        try:
            reply = await asyncio.wait_for(worker.io(worker.boot, child, self._payload),
                                           START_TIMEOUT_S)
        except (TimeoutError, EOFError, OSError) as exc:
            self._drop(worker)
            raise ScoringCrashed("", f"a scoring worker did not start "
                                 f"({type(exc).__name__}: {exc}; {worker.exit_note()}): see "
                                 "its error above; a script must start its run under `if "
                                 "__name__ == '__main__':` (workers are spawned)") from None
        except BaseException:
            self._drop(worker)
            raise
        if reply[0] == "init_error":
            self._drop(worker)
            self._broken = ScoringError(reply[1], f"a scoring worker could not start: "
                                        f"{reply[2]}", reply[3])
            self._check()
        log.info("%s: scoring worker %s started in %.2fs (%d of %d)", self.name, worker.pid,
                 time.monotonic() - t0, len(self._all), self.workers)
        return worker

    def _drop(self, worker: _Worker) -> None:
        worker.kill()
        self._all.discard(worker)
