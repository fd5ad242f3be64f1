"""``run_interruptible``: ``asyncio.run`` whose Ctrl-C always ends, within a bound.

``asyncio.run`` answers a first SIGINT by cancelling the main task and then waits, without a
limit, for it and for every other task to finish cancelling: one task that does not (a
cleanup that awaits a stuck peer) holds the process forever, and nothing says which. Here the
first SIGINT or SIGTERM cancels the main task the same way; its cancellation and then that of
every task left get ``grace_s`` seconds each. A task still running after that is named in the
log with its stack, abandoned with the loop, and ``KeyboardInterrupt`` is raised as
``asyncio.run`` would. A second signal raises ``KeyboardInterrupt`` at once. Without a signal
it behaves as ``asyncio.run``. Call it from the main thread (signal handlers).
"""

from __future__ import annotations

import asyncio
import io
import logging
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_interruptible(main: Coroutine[Any, Any, T], grace_s: float = 30.0) -> T:
    """Run ``main`` on a fresh event loop (module docstring)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    task = loop.create_task(main)
    ended: asyncio.Future[None] = loop.create_future()

    def end(*_: Any) -> None:
        if not ended.done():
            ended.set_result(None)

    task.add_done_callback(end)
    interrupts = 0

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1 or task.done():
            raise KeyboardInterrupt
        task.cancel()
        loop.call_soon_threadsafe(loop.call_later, grace_s, end)  # its cancellation, bounded

    previous = {s: signal.signal(s, on_signal) for s in SIGNALS}
    try:
        loop.run_until_complete(ended)
        if interrupts and not task.done():
            _name_stuck({task}, "the run's main task")
        _cancel_rest(loop, grace_s)
        if interrupts:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: the interrupt is what ended the run
            raise KeyboardInterrupt
        return task.result()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        asyncio.set_event_loop(None)
        loop.close()


def _cancel_rest(loop: asyncio.AbstractEventLoop, grace_s: float) -> None:
    """Cancel every task still pending; wait ``grace_s`` for them; name those that did not end;
    async generators and the default executor are closed without waiting on them."""
    rest = {t for t in asyncio.all_tasks(loop) if not t.done()}
    for t in rest:
        t.cancel()
    if rest:
        _, pending = loop.run_until_complete(asyncio.wait(rest, timeout=grace_s))
        if pending:
            _name_stuck(pending, "tasks")
    loop.run_until_complete(_bounded(loop.shutdown_asyncgens(), grace_s))
    loop.run_until_complete(_bounded(loop.shutdown_default_executor(), grace_s))


async def _bounded(work: Coroutine[Any, Any, Any], grace_s: float) -> None:
    done, _ = await asyncio.wait({asyncio.ensure_future(work)}, timeout=grace_s)
    for t in done:
        t.exception()  # retrieved: a failed shutdown step is not worth a second traceback


def _name_stuck(tasks: set[asyncio.Task[Any]], what: str) -> None:
    for t in tasks:
        stack = io.StringIO()
        t.print_stack(file=stack)
        log.warning("%s did not end within its grace after the interrupt (abandoned): %s",
                    what, stack.getvalue().strip())
