"""The hf engine's admission coalescing (``ArrivalWindow``) and its batched hand-off of
results to the event loop (``deliver``), with real threads, conditions and event loops."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

import torch

from gspo_rl.server.engines.base import Completion, SamplingParams
from gspo_rl.server.engines.hf.requests import ArrivalWindow, Request, deliver

GENEROUS = {"min_gap_s": 30.0, "max_gap_s": 30.0, "max_window_s": 60.0}


def never() -> bool:
    return False


def wait(window: ArrivalWindow, cond: threading.Condition, waiting: deque, running: int = 0,
         room: int = 64, interrupted=never) -> None:
    with cond:
        window.wait(cond, waiting, running, room, interrupted)


def feeder(cond: threading.Condition, waiting: deque, n: int, pause_s: float,
           stop: threading.Event | None = None) -> threading.Thread:
    """Appends ``n`` arrivals (or until ``stop``) from another thread, notifying each, the
    way ``HFEngine.generate`` queues a request."""
    def run() -> None:
        for i in range(n):
            if stop is not None and stop.is_set():
                return
            time.sleep(pause_s)
            with cond:
                waiting.append(i)
                cond.notify_all()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_no_window_unless_replacements_are_due_and_the_batch_is_empty() -> None:
    cond, window = threading.Condition(), ArrivalWindow(**GENEROUS)
    waiting: deque = deque([0])
    wait(window, cond, waiting)  # nothing ended: nothing is due
    window.ended(4)
    wait(window, cond, waiting, running=3)  # a running batch is never held back
    wait(window, cond, waiting, interrupted=lambda: True)  # paused or stopping
    wait(window, cond, waiting, room=1)  # the batch would be full
    waiting.extend([1, 2, 3])
    wait(window, cond, waiting)  # every replacement is here
    assert window.waits == 0


def test_waits_for_the_replacements_of_what_ended() -> None:
    cond, window = threading.Condition(), ArrivalWindow(**GENEROUS)
    window.ended(4)
    waiting: deque = deque([0])
    thread = feeder(cond, waiting, 3, 0.01)
    wait(window, cond, waiting)  # returns as soon as the fourth is queued
    thread.join()
    assert list(waiting) == [0, 0, 1, 2] and window.waits == 1
    window.admitted(4)
    assert window.expected == 0


def test_the_window_is_bounded_even_while_arrivals_keep_coming() -> None:
    cond = threading.Condition()
    window = ArrivalWindow(min_gap_s=1.0, max_gap_s=1.0, max_window_s=0.05)
    window.ended(10_000)  # far more due than will come within the window
    waiting: deque = deque([-1])
    stop = threading.Event()
    thread = feeder(cond, waiting, 10_000, 0.001, stop)
    wait(window, cond, waiting)  # closes at max_window_s, not when 10,000 arrived
    stop.set()
    thread.join()
    assert window.waits == 1 and len(waiting) < 10_000


def test_missing_arrivals_end_the_window_and_the_expectation() -> None:
    cond = threading.Condition()
    window = ArrivalWindow(min_gap_s=0.001, max_gap_s=0.001, max_window_s=0.05)
    window.ended(8)
    waiting: deque = deque([0])
    wait(window, cond, waiting)  # nobody else comes: closes after one gap
    assert window.waits == 1 and window.expected == 0
    wait(window, cond, waiting)  # given up: the next lone arrival does not wait again
    assert window.waits == 1


def test_deliver_settles_each_future_once_on_its_loop() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        reqs = [Request([1], SamplingParams(), loop.create_future(), loop, torch.Generator())
                for _ in range(3)]
        reqs[2].future.cancel()  # its caller went away: skipped, not an error
        done = reqs[0].completion("length")
        failed = RuntimeError("engine failed")
        thread = threading.Thread(target=deliver, args=(
            [(reqs[0], done), (reqs[1], failed), (reqs[2], done)],))
        thread.start()
        assert await reqs[0].future is done
        try:
            await reqs[1].future
        except RuntimeError as exc:
            assert exc is failed
        else:
            raise AssertionError("the failure was not delivered")
        thread.join()
        assert reqs[2].future.cancelled()
        assert isinstance(done, Completion) and done.finish_reason == "length"

    asyncio.run(asyncio.wait_for(body(), 30))
