"""The plain transformers engine: continuous batching on one model, exact log-probabilities.

No extra install, runs anywhere torch runs (float32 on CPU by default), and is the reference
the vLLM engine is checked against. One scheduler thread owns the model and the running batch
(``gspo_rl.server.engines.hf.scheduler``); the event loop only queues requests and awaits
futures. Each iteration admits waiting requests (one left-padded prefill merged into
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
from collections.abc import AsyncGenerator, Iterable
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
from gspo_rl.server.engines.hf.loading import check_weights, load_model, resolve_device
from gspo_rl.server.engines.hf.requests import ArrivalWindow, Request, deliver
from gspo_rl.server.engines.hf.running import RunningKV
from gspo_rl.server.engines.hf.scheduler import LOCK_TIMEOUT_S, Scheduler

if TYPE_CHECKING:
    from gspo_rl.contract.weights.lora import BaseCopy, LoraSpec

log = logging.getLogger(__name__)


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
        config = AutoConfig.from_pretrained(self._base_path)
        self.vocab_size = int(config.vocab_size)
        limit = int(config.max_position_embeddings)
        self.max_model_len = min(max_model_len or limit, limit)
        pad = self.tokenizer.pad_token_id
        self._pad_id = int(pad if pad is not None else 0)
        self.model: torch.nn.Module | None = None
        self._thread: threading.Thread | None = None
        # the queue, the running batch and its thread's state; tests pass windows of their own
        self._sched = Scheduler(
            max_batch_size=max_batch_size, max_model_len=self.max_model_len,
            device=self.device, stop_tokenizer=AutoTokenizer.from_pretrained(self.model_path),
            window=arrival_window or ArrivalWindow())

    # ------------------------------------------------------------------ lifecycle

    @property
    def policy_version(self) -> int:
        return self._sched.version

    async def start(self) -> None:
        if self._thread is not None:
            return
        model, self._base_copy = await asyncio.to_thread(
            load_model, self._base_path, self.dtype, self.device, self._adapter, self.model_path)
        self.model = model
        self._sched.kv = RunningKV(model, self._pad_id, self.device)
        self._thread = threading.Thread(target=self._sched.run, name="hf-engine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        sched = self._sched
        with sched.cond:
            sched.stopping = True
            sched.cond.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, LOCK_TIMEOUT_S)
        with sched.cond:  # normally the thread did this; not if it is stuck in a step (its
            leftover = list(sched.waiting) + list(sched.rows)  # rows stay: it may use them)
            sched.waiting.clear()
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
        sched = self._sched
        with sched.cond:
            if sched.stopping or self._thread is None or sched.error is not None:
                raise EngineUnavailable(f"engine is not running (error: {sched.error!r})")
            sched.waiting.append(req)
            sched.cond.notify_all()
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
        with self._sched.cond:
            self._sched.paused = True
        await asyncio.to_thread(self._sched.wait_for_step)

    async def resume(self) -> None:
        with self._sched.cond:
            self._sched.paused = False
            self._sched.cond.notify_all()

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
        await asyncio.to_thread(self._sched.between_steps, version, base.merge_into,
                                self.named_weights(), tensors, lora)

    def named_weights(self) -> dict[str, torch.Tensor]:
        if self.model is None:
            raise EngineUnavailable("engine not started")
        return dict(self.model.named_parameters(remove_duplicate=False))

    def _load_weights_sync(self, items: list[tuple[str, torch.Tensor]], version: int) -> None:
        params = self.named_weights()
        check_weights(params, items)
        self._sched.between_steps(version, self._copy_in, params, items)

    @torch.no_grad()
    def _copy_in(self, params: dict[str, torch.Tensor],
                 items: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in items:
            params[name].copy_(tensor.to(device=self.device, dtype=self.dtype))

    def stats(self) -> EngineStats:
        sched = self._sched
        extra = dict(sched.counters, coalesce_waits=float(sched.window.waits),
                     coalesce_wait_seconds=sched.window.waited_s)
        return EngineStats(running=len(sched.rows), waiting=len(sched.waiting), extra=extra)

    def dead_reason(self) -> str | None:
        if self._sched.error is not None:
            return f"the hf engine's scheduler failed: {self._sched.error!r}"
        if (self._thread is not None and not self._thread.is_alive()
                and not self._sched.stopping):
            return "the hf engine's scheduler thread exited"
        return None
