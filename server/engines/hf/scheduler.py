"""The transformers engine's scheduler: the thread that owns the running batch, and the state
it shares with the engine's event loop (``gspo_rl.server.engines.hf.engine.HFEngine``).

``Scheduler.run`` is the thread: each iteration admits waiting requests (one left-padded
prefill merged into the running KV cache, ``RunningKV``), then runs one decode step for every
running row; finished or cancelled rows leave at once. The queue and the flags (``waiting``,
``paused``, ``stopping``, ``error``) change only under ``cond``; a step runs under
``step_lock``, which ``between_steps`` takes to change the weights (and the policy version)
between two steps. A failed step ends every request with ``EngineUnavailable``; a stop ends
them as aborted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from gspo_rl.server.engines.errors import EngineUnavailable
from gspo_rl.server.engines.hf import attention as hf_attention
from gspo_rl.server.engines.hf import batch as hf_batch
from gspo_rl.server.engines.hf.requests import (
    ArrivalWindow,
    Outcome,
    Request,
    deliver,
    finish_reason,
    notify_progress,
)
from gspo_rl.server.engines.hf.running import RunningKV

log = logging.getLogger(__name__)
LOCK_TIMEOUT_S = 120.0  # longest wait for a running step before pause / load_weights give up
IDLE_POLL_S = 0.5  # the scheduler re-checks its flags at least this often


class Scheduler:
    """The running batch and its thread (see the module docstring). ``kv`` is set once the
    model is loaded, before ``run`` starts."""

    def __init__(self, *, max_batch_size: int, max_model_len: int, device: torch.device,
                 stop_tokenizer: Any, window: ArrivalWindow) -> None:
        self.max_batch_size, self.max_model_len = max_batch_size, max_model_len
        self.device = device
        # decodes for stop strings: its own instance, as a Rust tokenizer shared across
        # threads can fail with "Already borrowed" when the server encodes
        self.stop_tokenizer = stop_tokenizer
        self.window = window  # coalesces arrivals into one prefill (hf_requests)
        self.cond = threading.Condition()
        self.step_lock = threading.Lock()
        self.waiting: deque[Request] = deque()
        self.rows: list[Request] = []
        self.paused = self.stopping = False
        self.error: BaseException | None = None
        self.version = 0
        self.kv: RunningKV | None = None
        self.stale_cache = False  # the running batch's cache predates the current weights
        self.counters = {"max_batch_size_observed": 0.0, "decode_steps": 0.0,
                         "prefills": 0.0, "tokens_generated": 0.0, "cache_recomputes": 0.0}

    def between_steps(self, version: int, write: Callable[..., None], *args: Any) -> None:
        """``write(*args)`` once no step runs, then the policy version is ``version``."""
        if not self.step_lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise TimeoutError(f"a decode step did not finish within {LOCK_TIMEOUT_S}s")
        try:
            write(*args)
            self.version = version
            self.stale_cache = bool(self.rows)
        finally:
            self.step_lock.release()

    def wait_for_step(self) -> None:
        """Returns once no step is running (``TimeoutError`` after ``LOCK_TIMEOUT_S``)."""
        if not self.step_lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise TimeoutError(f"a decode step did not finish within {LOCK_TIMEOUT_S}s")
        self.step_lock.release()

    def run(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.stopping and (
                        self.paused or not (self.waiting or self.rows)
                    ):
                        self.cond.wait(timeout=IDLE_POLL_S)
                    if self.stopping:
                        break
                    self.window.wait(self.cond, self.waiting, len(self.rows),
                                     self.max_batch_size, self._interrupted)
                with self.step_lock, torch.inference_mode(), \
                        hf_attention.step_backends(self.device):
                    if not self.paused:  # pause() may have won the race for the lock
                        start = time.perf_counter()
                        self._step()
                        self.window.stepped(time.perf_counter() - start)
        except BaseException as exc:  # a failed step fails every request, loudly
            log.exception("hf engine scheduler failed")
            with self.cond:
                self.error = exc
            failed = EngineUnavailable(f"engine failed: {exc!r}")
            deliver((req, failed) for req in self._take_all())
            return
        deliver((req, req.completion("abort")) for req in self._take_all())

    def _take_all(self) -> list[Request]:
        """Every request, waiting or running, taken out of the batch (to be ended)."""
        with self.cond:
            taken = list(self.waiting) + self.rows
            self.waiting.clear()
            self.rows = []
        return taken

    def _interrupted(self) -> bool:
        return self.paused or self.stopping

    def _step(self) -> None:
        self._evict([r.cancelled for r in self.rows])
        if self.stale_cache and self.rows:
            self._recompute_cache()
        self.stale_cache = False
        with self.cond:
            room = self.max_batch_size - len(self.rows)
            admit: list[Request] = []
            while self.waiting and len(admit) < room:
                req = self.waiting.popleft()
                if not req.cancelled:
                    admit.append(req)
        self.window.admitted(len(admit))
        if admit:
            self._prefill(admit)
        if self.rows:
            self._decode()

    def _prefill(self, reqs: list[Request]) -> None:
        assert self.kv is not None
        merge = bool(self.rows)
        logits_BV = self.kv.prefill([r.prompt for r in reqs], merge)
        self.counters["prefills"] += 1
        start = len(self.rows) if merge else 0
        self.rows = (self.rows if merge else []) + reqs
        self.counters["max_batch_size_observed"] = max(
            self.counters["max_batch_size_observed"], float(len(self.rows)))
        self._sample(logits_BV, offset=start)

    def _recompute_cache(self) -> None:
        """Rebuild the running rows' KV cache with the current weights (after an update), so
        later tokens are sampled from exactly the new policy given the whole prefix."""
        assert self.kv is not None
        self.kv.recompute([r.prompt + r.token_ids[:-1] for r in self.rows])  # pending: last
        self.counters["cache_recomputes"] += 1

    def _decode(self) -> None:
        assert self.kv is not None
        self.counters["decode_steps"] += 1
        self._sample(self.kv.decode(), offset=0)

    def _sample(self, logits_BV: torch.Tensor, offset: int) -> None:
        """Sample for rows ``offset..``, record the tokens, evict finished rows, and only then
        resolve them (so a caller that sees its result also sees it gone from ``stats``)."""
        assert self.kv is not None
        rows = self.rows[offset:]
        got = hf_batch.sample_rows(logits_BV, [r.params for r in rows],
                                   [r.generator for r in rows])
        self.kv.set_pending(offset, got.token_ids_B)
        self.counters["tokens_generated"] += len(rows)
        ends: list[Outcome] = []
        finished = [False] * offset
        for i, req in enumerate(rows):
            req.record(got.token_ids[i], got.logprobs[i], self.version, got.top_logprobs[i])
            end = finish_reason(req, self.stop_tokenizer, self.max_model_len)
            finished.append(end is not None)
            if end is not None:
                ends.append((req, req.completion(*end)))
        self._evict(finished)
        self.window.ended(len(ends))
        deliver(ends)
        notify_progress(r for r, done in zip(rows, finished[offset:], strict=True) if not done)

    def _evict(self, drop: list[bool]) -> None:
        """Remove rows flagged in ``drop`` and cache columns no remaining row attends to."""
        if not any(drop):
            return
        assert self.kv is not None
        keep = [i for i, d in enumerate(drop) if not d]
        self.rows = [self.rows[i] for i in keep]
        self.kv.keep(keep)
