"""The ``AsyncEngineArgs`` fields the vLLM engine chooses (``engine_kwargs``), and the ones
the caller may not override (``RESERVED_ENGINE_ARGS``). Pure: no vLLM import.

On CPU: eager mode, 1 GiB of KV cache unless told otherwise, and our worker class (seeded
requests fixed for chunked prefill, ``gspo_rl.server.engines.vllm.cpu_worker``); on GPUs CUDA
graphs and ``gpu_memory_utilization`` (vLLM's 0.9 when None). Native LoRA serving adds
``native_lora.engine_kwargs``.
"""

from __future__ import annotations

from typing import Any

from gspo_rl.server.engines.vllm import native_lora

# AsyncEngineArgs the engine's contract depends on (log-prob semantics, weight transfer,
# batching limits it validates against): ``engine_args`` may not override them.
RESERVED_ENGINE_ARGS = frozenset({
    "model", "tokenizer", "max_model_len", "max_num_seqs", "logprobs_mode",
    "generation_config", "worker_extension_cls", "weight_transfer_config", "worker_cls",
    "enable_lora", "max_lora_rank", "max_loras", "max_cpu_loras",  # max_lora_rank here
})
WORKER_EXTENSION = "gspo_rl.server.engines.vllm.worker.GspoWorkerExtension"
# On CPU: vLLM's worker with seeded requests fixed for chunked prefill (see that module).
CPU_WORKER_CLS = "gspo_rl.server.engines.vllm.cpu_worker.GspoCPUWorker"


def engine_kwargs(*, on_cpu: bool, dtype: str, seed: int, tensor_parallel_size: int,
                  enforce_eager: bool | None, kv_cache_gib: float | None,
                  gpu_memory_utilization: float | None, engine_args: dict[str, Any] | None,
                  max_lora_rank: int | None) -> dict[str, Any]:
    """The fields ``VLLMEngine.start`` passes to ``AsyncEngineArgs`` besides the model and its
    limits; ``ValueError`` if ``engine_args`` names a reserved one."""
    reserved = sorted(RESERVED_ENGINE_ARGS & set(engine_args or {}))
    if reserved:
        raise ValueError(f"engine args {reserved} are set by the gspo vLLM engine itself")
    if kv_cache_gib is None and on_cpu:
        kv_cache_gib = 1.0
    kw: dict[str, Any] = dict(
        dtype=dtype, seed=seed, tensor_parallel_size=tensor_parallel_size,
        enforce_eager=on_cpu if enforce_eager is None else enforce_eager,
        kv_cache_memory_bytes=None if kv_cache_gib is None else int(kv_cache_gib * 2**30))
    if on_cpu:  # without it a seeded request split by chunked prefill kills the engine
        kw["worker_cls"] = CPU_WORKER_CLS
    if gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = gpu_memory_utilization
    kw.update(engine_args or {})
    if max_lora_rank is not None:
        kw.update(native_lora.engine_kwargs(int(max_lora_rank)))
    return kw
