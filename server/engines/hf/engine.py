"""The plain transformers engine: continuous batching on one model, exact log-probabilities.

No extra install, runs anywhere torch runs (float32 on CPU by default), and is the reference
the vLLM engine is checked against. One scheduler thread owns the model and the running batch
(``gspo_rl.server.engines.hf.running.RunningKV``); the event loop only queues requests and
awaits futures. Each iteration admits waiting requests (one left-padded prefill merged into
the running KV cache), then runs one decode step for every running row; finished or cancelled
rows leave at once (continuous batching).

Contract: weights change only between steps (``pause``; ``load_weights`` under the step lock);
every token records the policy version of the step that sampled it, and after an update the
running rows' KV cache is recomputed, so a token tagged v was sampled from exactly pi_v.
Log-probabilities are ``log_softmax(logits / T)`` at the sampled token, after top-k / top-p
truncation and renormalisation (``gspo_rl.contract.sampling_dist.keep_mask``, vLLM's kept
set); greedy requests (T = 0) report them under T = 1. Stop strings are matched on the decoded
completion and the completing token is kept; only ``stop_token_ids`` end a completion on a
token (no implicit EOS). Design notes: docs/design/hf-engine.md.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gspo_rl.server.engines.base import (
    Completion,
    Engine,
    EngineStats,
    Partial,
    SamplingParams,
    validate_request,
)
from gspo_rl.server.engines.errors import EngineUnavailable
from gspo_rl.server.engines.hf import attention as hf_attention
from gspo_rl.server.engines.hf import batch as hf_batch
from gspo_rl.server.engines.hf.loading import check_weights, load_model, resolve_device
from gspo_rl.server.engines.hf.requests import (
    ArrivalWindow,
    Outcome,
    Request,
    deliver,
    finish_reason,
    notify_progress,
)
from gspo_rl.server.engines.hf.running import RunningKV

if TYPE_CHECKING:
    from gspo_rl.contract.weights.lora import BaseCopy, LoraSpec

log = logging.getLogger(__name__)
LOCK_TIMEOUT_S = 120.0  # longest wait for a running step before pause / load_weights give up
IDLE_POLL_S = 0.5  # the scheduler re-checks its flags at least this often


class HFEngine(Engine):
    """transformers + torch engine with continuous batching (see the module docstring)."""

    name = "hf"
    logprobs_after_truncation = True

    def __init__(
        self,
        model_path: str,
        *,
        max_batch_size: int = 64,
        device: str | None = None,
        dtype: torch.dtype = torch.float32,
        max_model_len: int | None = None,
        arrival_window: ArrivalWindow | None = None,
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer

        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        self.model_path = str(model_path)
        # A LoRA checkpoint (PEFT adapter directory): its base, with the adapter merged at start
        self._adapter: list[Any] | None = None  # [adapter tensors, LoraSpec]
        self._base_copy: BaseCopy | None = None  # W0 that adapters merge into
        self._base_path = self.model_path
        if (Path(self.model_path) / "adapter_config.json").is_file():
            from gspo_rl.contract.weights.lora import read_peft_adapter

            self._base_path, *self._adapter = read_peft_adapter(self.model_path)
        self.max_batch_size = max_batch_size
        self.device = resolve_device(device)
        self.dtype = dtype
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        # The scheduler thread decodes for stop strings with its own instance: a Rust tokenizer
        # shared across threads can fail with "Already borrowed" when the server encodes.
        self._stop_tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        config = AutoConfig.from_pretrained(self._base_path)
        self.vocab_size = int(config.vocab_size)
        limit = int(config.max_position_embeddings)
        self.max_model_len = min(max_model_len or limit, limit)
        pad = self.tokenizer.pad_token_id
        self._pad_id = int(pad if pad is not None else 0)
        self.model: torch.nn.Module | None = None
        self._version = 0
        self._cond = threading.Condition()
        self._step_lock = threading.Lock()
        self._waiting: deque[Request] = deque()
        self._rows: list[Request] = []
        self._paused = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._counters = {"max_batch_size_observed": 0.0, "decode_steps": 0.0,
                          "prefills": 0.0, "tokens_generated": 0.0, "cache_recomputes": 0.0}
        # the running batch's tensors (made at start), owned by the scheduler thread
        self._kv: RunningKV | None = None
        self._stale_cache = False  # the running batch's cache predates the current weights
        # coalesces arrivals into one prefill (hf_requests); tests pass bounds of their own
        self._window = arrival_window or ArrivalWindow()

    # ------------------------------------------------------------------ lifecycle

    @property
    def policy_version(self) -> int:
        return self._version

    async def start(self) -> None:
        if self._thread is not None:
            return
        model, self._base_copy = await asyncio.to_thread(
            load_model, self._base_path, self.dtype, self.device, self._adapter, self.model_path)
        self.model = model
        self._kv = RunningKV(model, self._pad_id, self.device)
        self._thread = threading.Thread(target=self._run, name="hf-engine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, LOCK_TIMEOUT_S)
        with self._cond:  # normally the thread did this; not if it is stuck in a step (its
            leftover = list(self._waiting) + list(self._rows)  # rows stay: it may still use them)
            self._waiting.clear()
        deliver((req, req.completion("abort")) for req in leftover)

    # ------------------------------------------------------------------ requests

    def _submit(self, prompt_token_ids: list[int], params: SamplingParams,
                progress: asyncio.Event | None = None) -> Request:
        validate_request(prompt_token_ids, params, self.vocab_size, self.max_model_len)
        loop = asyncio.get_running_loop()
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        req = Request(list(prompt_token_ids), params, loop.create_future(), loop, gen,
                      progress=progress)
        with self._cond:
            if self._stopping or self._thread is None or self._error is not None:
                raise EngineUnavailable(f"engine is not running (error: {self._error!r})")
            self._waiting.append(req)
            self._cond.notify_all()
        return req

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Completion:
        req = self._submit(prompt_token_ids, params)
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled = True  # the scheduler drops it before its next step
            raise

    async def generate_stream(self, prompt_token_ids: list[int], params: SamplingParams
                              ) -> AsyncGenerator[Partial | Completion, None]:
        """The scheduler wakes the reader after each step that added tokens (one wake-up per
        event loop and step, ``hf_requests.notify_progress``); the reader reports what the
        step recorded (``Request.produced``, set after every list was appended)."""
        req = self._submit(prompt_token_ids, params, progress=asyncio.Event())
        assert req.progress is not None
        reported = 0
        try:
            while not req.future.done():
                await req.progress.wait()
                req.progress.clear()
                n = req.produced
                if n > reported and not req.future.done():
                    reported = n
                    yield Partial(req.token_ids, req.logprobs,
                                  req.top if params.top_logprobs > 0 else None, n)
            yield req.future.result()
        finally:
            if not req.future.done():
                req.cancelled = True  # the scheduler drops it before its next step

    # ------------------------------------------------------------------ control

    async def pause(self) -> None:
        """Returns once no step is running; the scheduler then waits until ``resume``."""
        with self._cond:
            self._paused = True
        await asyncio.to_thread(self._wait_for_step)

    async def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def _wait_for_step(self) -> None:
        if not self._step_lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise TimeoutError(f"a decode step did not finish within {LOCK_TIMEOUT_S}s")
        self._step_lock.release()

    async def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Copy named tensors (HF checkpoint names) into the model between steps, then set
        the version. All names and shapes are checked before anything is copied. With tied
        embeddings the output layer is the embedding tensor, so it follows either name."""
        items = list(weights)
        await asyncio.to_thread(self._load_weights_sync, items, int(version))
        if self._base_copy is not None:  # a new base for later adapters
            self._base_copy.forget()

    async def load_adapter(self, tensors: list[tuple[str, torch.Tensor]], lora: LoraSpec,
                           version: int) -> None:
        """Merged into the weights in place (``BaseCopy.merge_into``) between steps."""
        from gspo_rl.contract.weights.lora import BaseCopy

        base = self._base_copy = self._base_copy or BaseCopy()
        await asyncio.to_thread(self._between_steps, version, base.merge_into,
                                self.named_weights(), tensors, lora)

    def named_weights(self) -> dict[str, torch.Tensor]:
        if self.model is None:
            raise EngineUnavailable("engine not started")
        return dict(self.model.named_parameters(remove_duplicate=False))

    def _load_weights_sync(self, items: list[tuple[str, torch.Tensor]], version: int) -> None:
        params = self.named_weights()
        check_weights(params, items)
        self._between_steps(version, self._copy_in, params, items)

    @torch.no_grad()
    def _copy_in(self, params: dict[str, torch.Tensor],
                 items: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in items:
            params[name].copy_(tensor.to(device=self.device, dtype=self.dtype))

    def _between_steps(self, version: int, write: Callable[..., None], *args: Any) -> None:
        """``write(*args)`` once no decode step runs, then the policy version is ``version``."""
        if not self._step_lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise TimeoutError(f"a decode step did not finish within {LOCK_TIMEOUT_S}s")
        try:
            write(*args)
            self._version = version
            self._stale_cache = bool(self._rows)
        finally:
            self._step_lock.release()

    def stats(self) -> EngineStats:
        extra = dict(self._counters, coalesce_waits=float(self._window.waits),
                     coalesce_wait_seconds=self._window.waited_s)
        return EngineStats(running=len(self._rows), waiting=len(self._waiting), extra=extra)

    def dead_reason(self) -> str | None:
        if self._error is not None:
            return f"the hf engine's scheduler failed: {self._error!r}"
        if self._thread is not None and not self._thread.is_alive() and not self._stopping:
            return "the hf engine's scheduler thread exited"
        return None

    # ------------------------------------------------------------------ scheduler thread

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and (
                        self._paused or not (self._waiting or self._rows)
                    ):
                        self._cond.wait(timeout=IDLE_POLL_S)
                    if self._stopping:
                        break
                    self._window.wait(self._cond, self._waiting, len(self._rows),
                                      self.max_batch_size, self._interrupted)
                with self._step_lock, torch.inference_mode(), \
                        hf_attention.step_backends(self.device):
                    if not self._paused:  # pause() may have won the race for the lock
                        start = time.perf_counter()
                        self._step()
                        self._window.stepped(time.perf_counter() - start)
        except BaseException as exc:  # a failed step fails every request, loudly
            log.exception("hf engine scheduler failed")
            with self._cond:
                self._error = exc
            failed = EngineUnavailable(f"engine failed: {exc!r}")
            deliver((req, failed) for req in self._take_all())
            return
        deliver((req, req.completion("abort")) for req in self._take_all())

    def _take_all(self) -> list[Request]:
        """Every request, waiting or running, taken out of the engine (to be ended)."""
        with self._cond:
            taken = list(self._waiting) + self._rows
            self._waiting.clear()
            self._rows = []
        return taken

    def _interrupted(self) -> bool:
        return self._paused or self._stopping

    def _step(self) -> None:
        self._evict([r.cancelled for r in self._rows])
        if self._stale_cache and self._rows:
            self._recompute_cache()
        self._stale_cache = False
        with self._cond:
            room = self.max_batch_size - len(self._rows)
            admit: list[Request] = []
            while self._waiting and len(admit) < room:
                req = self._waiting.popleft()
                if not req.cancelled:
                    admit.append(req)
        self._window.admitted(len(admit))
        if admit:
            self._prefill(admit)
        if self._rows:
            self._decode()

    def _prefill(self, reqs: list[Request]) -> None:
        assert self._kv is not None
        merge = bool(self._rows)
        logits_BV = self._kv.prefill([r.prompt for r in reqs], merge)
        self._counters["prefills"] += 1
        start = len(self._rows) if merge else 0
        self._rows = (self._rows if merge else []) + reqs
        self._counters["max_batch_size_observed"] = max(
            self._counters["max_batch_size_observed"], float(len(self._rows)))
        self._sample(logits_BV, offset=start)

    def _recompute_cache(self) -> None:
        """Rebuild the running rows' KV cache with the current weights (after an update), so
        later tokens are sampled from exactly the new policy given the whole prefix."""
        assert self._kv is not None
        self._kv.recompute([r.prompt + r.token_ids[:-1] for r in self._rows])  # pending: last
        self._counters["cache_recomputes"] += 1

    def _decode(self) -> None:
        assert self._kv is not None
        self._counters["decode_steps"] += 1
        self._sample(self._kv.decode(), offset=0)

    def _sample(self, logits_BV: torch.Tensor, offset: int) -> None:
        """Sample for rows ``offset..``, record the tokens, evict finished rows, and only then
        resolve them (so a caller that sees its result also sees it gone from ``stats``)."""
        assert self._kv is not None
        rows = self._rows[offset:]
        got = hf_batch.sample_rows(logits_BV, [r.params for r in rows],
                                   [r.generator for r in rows])
        self._kv.set_pending(offset, got.token_ids_B)
        self._counters["tokens_generated"] += len(rows)
        ends: list[Outcome] = []
        finished = [False] * offset
        for i, req in enumerate(rows):
            req.record(got.token_ids[i], got.logprobs[i], self._version, got.top_logprobs[i])
            end = finish_reason(req, self._stop_tokenizer, self.max_model_len)
            finished.append(end is not None)
            if end is not None:
                ends.append((req, req.completion(*end)))
        self._evict(finished)
        self._window.ended(len(ends))
        deliver(ends)
        notify_progress(r for r, done in zip(rows, finished[offset:], strict=True) if not done)

    def _evict(self, drop: list[bool]) -> None:
        """Remove rows flagged in ``drop`` and cache columns no remaining row attends to."""
        if not any(drop):
            return
        assert self._kv is not None
        keep = [i for i, d in enumerate(drop) if not d]
        self._rows = [self._rows[i] for i in keep]
        self._kv.keep(keep)
