"""The transformers engine's requests: their state, when they end, their hand-off to the
event loop, and when the scheduler admits them. No tensors here but a request's generator:
the batch lives in ``scheduler`` and ``batch``.

Hand-off: the scheduler thread settles the futures of every request that ended in a step with
one ``call_soon_threadsafe`` per event loop (``deliver``), not one per request.

Coalescing (``ArrivalWindow``): when the running batch is empty and fewer requests are waiting
than just finished, the scheduler waits for more, so that a refill trickling in over HTTP is
prefilled as one batch. Always bounded: it stops as soon as as many are waiting as finished
(or the batch would be full), when no new request arrived for one engine step's time, and
after a few steps' time in all. A running batch is never held back, and callers whose
replacements arrive at once never wait. Why: docs/design/hf-engine.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from gspo_rl.server.engines.base import Completion, FinishReason, SamplingParams


@dataclass(eq=False)
class Request:
    """One completion being generated, owned by the scheduler thread once queued."""

    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future[Completion]
    loop: asyncio.AbstractEventLoop
    generator: torch.Generator
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    cancelled: bool = False
    progress: asyncio.Event | None = None  # set when tokens were added (streamed requests)
    produced: int = 0  # tokens recorded in every list (set after the step appended them)

    def record(self, token_id: int, logprob: float, version: int,
               top: list[tuple[int, float]] | None) -> None:
        """The token a step sampled: every list appended, then ``produced`` (what a streaming
        reader may report) moved past it."""
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)
        self.versions.append(version)
        if top is not None:
            self.top.append(top)
        self.produced = len(self.token_ids)

    def completion(self, reason: FinishReason, stop_string: str | None = None) -> Completion:
        return Completion(
            token_ids=self.token_ids, logprobs=self.logprobs, policy_versions=self.versions,
            finish_reason=reason, stop_string=stop_string,
            top_logprobs=self.top if self.params.top_logprobs > 0 else None,
        )


Outcome = tuple[Request, Completion | BaseException]


def finish_reason(req: Request, stop_tokenizer: Any, max_model_len: int
                  ) -> tuple[FinishReason, str | None] | None:
    """Why ``req`` ends after its latest token (stop conditions win over length)."""
    p = req.params
    if req.token_ids[-1] in p.stop_token_ids:
        return "stop", None
    if p.stop:
        longest = max(len(s) for s in p.stop)
        tail = stop_tokenizer.decode(req.token_ids[-(4 * longest + 4):])
        hit = next((s for s in p.stop if s and s in tail), None)
        if hit is not None:
            return "stop", hit
    if len(req.token_ids) >= p.max_tokens or (
        len(req.prompt) + len(req.token_ids) >= max_model_len
    ):
        return "length", None
    return None


def deliver(outcomes: Iterable[Outcome]) -> None:
    """Settles the requests' futures: one ``call_soon_threadsafe`` per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Outcome]] = {}
    for req, value in outcomes:
        by_loop.setdefault(req.loop, []).append((req, value))
    for loop, items in by_loop.items():
        # RuntimeError: the event loop is closed, nobody is waiting any more
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, items)


def _settle(items: list[Outcome]) -> None:
    for req, value in items:
        if req.future.done():
            continue
        if isinstance(value, BaseException):
            req.future.set_exception(value)
        else:
            req.future.set_result(value)
        if req.progress is not None:
            req.progress.set()


def notify_progress(reqs: Iterable[Request]) -> None:
    """Wakes the streamed requests' readers after a step (one call per event loop)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}
    for req in reqs:
        if req.progress is not None:
            by_loop.setdefault(req.loop, []).append(req.progress)
    for loop, events in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads
            loop.call_soon_threadsafe(_set_all, events)


def _set_all(events: list[asyncio.Event]) -> None:
    for event in events:
        event.set()


class ArrivalWindow:
    """The coalescing policy (module docstring). Used by the scheduler thread only, except
    ``wait``, which it calls holding the engine's condition (``generate`` notifies it)."""

    def __init__(self, gap_steps: float = 1.0, max_steps: float = 4.0,
                 min_gap_s: float = 0.5e-3, max_gap_s: float = 20e-3,
                 max_window_s: float = 50e-3) -> None:
        self.gap_steps, self.max_steps = gap_steps, max_steps  # in step times
        self.min_gap_s, self.max_gap_s, self.max_window_s = min_gap_s, max_gap_s, max_window_s
        self.expected = 0  # requests that ended and have not been replaced yet
        self.step_s = 0.0  # moving average of a step's duration
        self.waits = 0
        self.waited_s = 0.0

    def ended(self, n: int) -> None:
        self.expected += n

    def admitted(self, n: int) -> None:
        self.expected = max(0, self.expected - n)

    def stepped(self, seconds: float) -> None:
        self.step_s = seconds if self.step_s == 0 else 0.9 * self.step_s + 0.1 * seconds

    def wait(self, cond: threading.Condition, waiting: deque[Request], running: int,
             room: int, interrupted: Callable[[], bool]) -> None:
        """Blocks (releasing ``cond``) while the window is open; see the module docstring.
        ``interrupted()``: stop at once (pause, shutdown)."""
        target = min(self.expected, room)
        if running or not waiting or len(waiting) >= target or interrupted():
            return
        gap = min(max(self.gap_steps * self.step_s, self.min_gap_s), self.max_gap_s)
        start = time.monotonic()
        deadline = start + min(max(self.max_steps * self.step_s, gap), self.max_window_s)
        self.waits += 1
        while len(waiting) < target and not interrupted():
            seen = len(waiting)
            left = deadline - time.monotonic()
            if left <= 0 or not cond.wait(min(gap, left)) or len(waiting) == seen:
                self.expected = 0  # the rest is not coming soon: wait for it no more
                break
        self.waited_s += time.monotonic() - start
