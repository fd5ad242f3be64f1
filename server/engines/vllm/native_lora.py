"""LoRA adapters served by vLLM's own LoRA support, loaded from memory (``max_lora_rank``).

The engine is started with ``enable_lora`` and one adapter slot. Every request names the one
adapter this server serves (``policy_request``: id 1, a path that is never read), so that an
adapter push reaches the requests in flight exactly as a weight load does. At start the
adapter is zero on every LoRA layer (the base model), or a PEFT directory's
adapter; each push replaces it inside every worker (``install``): the received tensors become
a ``vllm.lora.lora_model.LoRAModel`` in the worker's LoRA manager (vLLM's punica kernels apply
``B @ A`` in the forward), with no file on the way and no change to the base weights. vLLM
shards the adapter over tensor-parallel ranks and packs ``q/k/v`` and ``gate/up`` itself.

Runs in the worker processes (``install``, ``restore``: the adapter is kept in host memory
and installed again after vLLM drops it, which it does after every weight transfer) and the
server (``ServedModel``, ``policy_request``, ``engine_kwargs``). The merge alternative
(``gspo_rl.server.engines.vllm.adapter``) stays the default: docs/lora.md compares them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gspo_rl.contract.weights.lora import PEFT_PREFIX, LoraSpec, adapter_pairs
from gspo_rl.server.engines.errors import InvalidWeights, WeightSyncFailed

ADAPTER_ID = 1
ADAPTER_NAME = "gspo-policy"
# vLLM requires a path; it reads one only for an adapter id it has not registered, and ours is
# registered before the first request names it and never evicted (one adapter, one slot).
NOT_A_PATH = "/gspo/in-memory-adapter"
# The ranks vLLM's LoRAConfig accepts (``max_lora_rank``).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def rank_slot(rank: int) -> int:
    """The smallest rank vLLM accepts that holds ``rank``; ValueError above vLLM's largest."""
    for slot in VLLM_RANKS:
        if slot >= rank:
            return slot
    raise InvalidWeights(f"LoRA rank {rank} is above vLLM's largest ({VLLM_RANKS[-1]})")


@dataclass(frozen=True)
class ServedModel:
    """What a vLLM engine serves for a ``--model`` path: a plain model directory as it is; a
    PEFT adapter directory as its base plus the adapter, natively (``max_lora_rank`` raised to
    the adapter's rank), with the directory's tokenizer when it has one."""

    base: str
    tokenizer: str
    adapter_dir: str | None
    max_lora_rank: int | None

    @classmethod
    def of(cls, path: str, max_lora_rank: int | None) -> ServedModel:
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            return cls(path, path, None, max_lora_rank)
        from gspo_rl.contract.weights.lora import read_peft_adapter

        base, _, spec = read_peft_adapter(path)
        own = os.path.isfile(os.path.join(path, "tokenizer_config.json"))
        return cls(base, path if own else base, path, max(spec.rank, max_lora_rank or 0))


def engine_kwargs(max_lora_rank: int) -> dict[str, Any]:
    """``AsyncEngineArgs`` fields of native LoRA serving with adapters up to ``max_lora_rank``."""
    return {"enable_lora": True, "max_lora_rank": rank_slot(max_lora_rank), "max_loras": 1,
            "max_cpu_loras": 1}


def policy_request() -> Any:
    """The ``LoRARequest`` every generation names."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(ADAPTER_NAME, ADAPTER_ID, lora_path=NOT_A_PATH)


def _manager(model: torch.nn.Module) -> Any:
    manager = getattr(model, "lora_manager", None)  # vLLM sets it when it wraps the layers
    if manager is None:
        raise WeightSyncFailed("this vLLM engine was started without LoRA (max_lora_rank)")
    return manager


def _lora_model(manager: Any, named: Iterable[tuple[str, torch.Tensor]],
                spec: LoraSpec) -> Any:
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    named = list(named)
    adapter_pairs(named, spec)  # names and shapes, as for a merge
    helper = PEFTHelper.from_dict({"r": spec.rank, "lora_alpha": spec.alpha,
                                   "target_modules": list(spec.target_modules)})
    helper.validate_legal(manager.lora_config)
    model = manager.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    return LoRAModel.from_lora_tensors(
        # copies: vLLM folds the scale into B in place, and ``restore`` installs the kept ones
        ADAPTER_ID, {PEFT_PREFIX + n: t.detach().to("cpu", copy=True) for n, t in named}, helper,
        device="cpu", dtype=manager.lora_config.lora_dtype,
        model_vocab_size=getattr(manager, "vocab_size", None),
        weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
        skip_prefixes=getattr(model, "lora_skip_prefixes", None))


def install(model: torch.nn.Module, named: Iterable[tuple[str, torch.Tensor]] | None,
            spec: Mapping[str, Any] | LoraSpec | None) -> int:
    """Replace the served adapter with ``named`` (wire names, ``spec``), or with the empty
    adapter when ``spec`` is None; it is active in the worker's slot when this returns.
    Returns the number of adapted modules. Everything is built before the old one goes."""
    manager = _manager(model)
    kept: tuple[list[tuple[str, torch.Tensor]], LoraSpec] | None = None
    if spec is None:  # vLLM's warm-up adapter: zeros on every LoRA layer
        lora = manager.create_dummy_lora(ADAPTER_ID, 1,
                                         getattr(model, "embedding_modules", None) or {})
    else:
        lora_spec = spec if isinstance(spec, LoraSpec) else LoraSpec.model_validate(spec)
        kept = ([(n, t.detach().to("cpu")) for n, t in named or []], lora_spec)
        lora = _lora_model(manager, kept[0], lora_spec)
    manager.remove_adapter(ADAPTER_ID)
    manager.add_adapter(lora)
    manager.activate_adapter(ADAPTER_ID)
    model._gspo_lora = kept  # type: ignore[assignment]  # nn.Module's attributes: Tensor | Module
    return len(lora.loras)


def restore(model: torch.nn.Module) -> int:
    """Install the served adapter again: vLLM drops every adapter after it replaces base
    weights (its ``finish_weight_update`` resets the LoRA state)."""
    kept = getattr(model, "_gspo_lora", None)
    return install(model, *kept) if kept is not None else install(model, None, None)
