"""``ScoringPool``: at most ``workers`` spawned processes running one scorer, with a time limit.

A call takes an idle worker, or starts one while fewer than ``workers`` run, or waits (a wait
past ``WAIT_LOG_S`` is logged, at most once per 30 s); it sends its arguments and awaits the
reply within ``timeout_s``. Past it, or when the worker dies or the call is cancelled, the
worker is killed and a replacement started in its slot (``ScoringTimeout``,
``ScoringCrashed``); the scorer's own exception comes back as ``ScoringError``. A worker that
could not build the scorer breaks the pool: every later call raises that error. ``close()``
stops every worker; calls waiting for one raise. Contract in full: the package docstring.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from typing import Any

from gspo_rl.client.scoring.environment import HasScorer, pool_for_environment
from gspo_rl.client.scoring.errors import (
    RemoteTraceback,
    ScoringCrashed,
    ScoringError,
    ScoringTimeout,
)
from gspo_rl.client.scoring.pickling import PICKLE_ERRORS, file_modules, pickled, preload_entry
from gspo_rl.client.scoring.process import Worker
from gspo_rl.client.scoring.worker import worker_main

log = logging.getLogger("gspo_rl.client.scoring")

START_TIMEOUT_S = 120.0
"""How long a worker may take to start (imports, unpickling the scorer)."""
WAIT_LOG_S = 5.0
"""A call that waits this long for a free worker logs it (at most once per 30 s)."""


class ScoringPool:
    """At most ``workers`` processes running one scorer (the package docstring)."""

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
        entries = [preload_entry(p) for p in preload]
        named = {n for n, _ in entries}
        self._preload = entries + [e for e in file_modules(modules) if e[0] not in named]
        self.workers, self.timeout_s, self.name = workers, timeout_s, name
        self._ctx = multiprocessing.get_context("spawn")
        self._idle: list[Worker] = []
        self._all: set[Worker] = set()
        self._waiters: collections.deque[asyncio.Future[Worker | None]] = collections.deque()
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
        return pool_for_environment(cls, env, workers=workers, timeout_s=timeout_s)

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

    def _answer(self, worker: Worker, reply: tuple[Any, ...]) -> Any:
        self._give(worker)
        if reply[0] == "ok":
            return reply[1]
        err = ScoringError(*reply[1:])
        err.__cause__ = RemoteTraceback(reply[3])
        raise err

    def _crashed(self, worker: Worker) -> ScoringError:
        if self._closed:
            return ScoringError("", f"the {self.name} scoring pool is closed")
        log.warning("%s: scoring worker %s died (%s), another started", self.name, worker.pid,
                    worker.exit_note())
        return ScoringCrashed("", f"the scoring worker {worker.pid} died "
                              f"({worker.exit_note()})")

    async def _acquire(self) -> Worker:
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

    async def _wait_turn(self) -> Worker | None:
        """Wait for a free worker, or (None) a freed slot to start one in."""
        fut: asyncio.Future[Worker | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            done, _ = await asyncio.wait({fut}, timeout=WAIT_LOG_S)
            if not done:
                self._log_wait()
            return await fut
        except BaseException:
            self._forget(fut)
            raise

    def _forget(self, fut: asyncio.Future[Worker | None]) -> None:
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

    def _give(self, worker: Worker | None, replace: bool = False) -> None:
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

    def _retire(self, worker: Worker) -> None:
        """Kill a worker whose call failed or was abandoned; start another in its place."""
        worker.kill()
        self._all.discard(worker)
        if not self._closed:
            self._live -= 1
            self._give(None, replace=True)

    async def _boot_reserved(self) -> Worker:
        """Start a worker in a slot already counted in ``_live`` (freed again on failure)."""
        try:
            self._check()
            return await self._boot()
        except BaseException:
            self._live -= 1
            self._give(None)
            raise

    async def _boot(self) -> Worker:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=worker_main, args=(child, self._preload),
                                    name=f"gspo-scoring-{self.name}", daemon=True)
        worker = Worker(process, parent)
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

    def _drop(self, worker: Worker) -> None:
        worker.kill()
        self._all.discard(worker)
