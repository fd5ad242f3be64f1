"""FSDP2 data parallelism for the learner: sharded parameters, gradients and optimiser state.

``LearnerConfig.data_parallel = "fsdp2"`` (the default on CUDA under ``torchrun``) shards each
decoder layer and the root module with ``torch.distributed.fsdp.fully_shard``; the loop is the
one of ``gspo_rl.learner.parallel.distributed``. Contract: gradients are reduce-scattered as
plain sums, so the update stays exactly the single-process one; a rank with fewer microbatches
runs zero-weight passes (``Share.n_pad``), so every rank runs the same number of passes;
weights leave as full tensors (``gather_full`` into rank 0's CPU host copy, which
``BroadcastSync`` and ``save_pretrained`` see as an ordinary model). With LoRA
(``lora_rank``) the adapters are injected before sharding: the base stays frozen (and
sharded), only the adapters train, are gathered, pushed and saved (PEFT's format, from the
host copy's ``PeftModel``).

Checkpoints hold the *full* optimizer state keyed by parameter name (``"optimizer_format":
"fsdp2-full"``), so a checkpoint resumes under any world size and in either mode. Details:
docs/design/distributed.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gspo_rl.learner.data.batching import MicroBatch, MiniBatch

FULL_FORMAT = "fsdp2-full"
# Prefixes that wrappers (activation checkpointing, torch.compile, FSDP1) put into FQNs.
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def hf_name(fqn: str) -> str:
    """The Hugging Face checkpoint name of a parameter FQN, wrapper prefixes removed."""
    for p in _WRAPPER_PREFIXES:
        fqn = fqn.replace(p, "")
    return fqn


def check_names(sharded: Sequence[str], host: Sequence[str]) -> None:
    """The gathered names must be exactly the host copy's: a silent mismatch would push or
    save stale weights."""
    a, b = set(sharded), set(host)
    if a != b:
        raise ValueError(f"sharded and host parameter names differ: only sharded "
                         f"{sorted(a - b)[:5]}, only host {sorted(b - a)[:5]}")


def ids_to_names(osd: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """An ``Optimizer.state_dict()`` (parameters numbered in ``names`` order) re-keyed by
    parameter name: the format ``set_optimizer_state_dict(full_state_dict=True)`` loads."""
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]
    return {"state": {names[i]: s for i, s in osd["state"].items()}, "param_groups": groups}


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks to shard one by one: the classes HF lists in ``_no_split_modules``,
    else the children of the largest ``ModuleList``."""
    kinds = set(getattr(model, "_no_split_modules", None) or [])
    found = [m for m in model.modules() if type(m).__name__ in kinds]
    if found:
        return found
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return [*max(lists, key=len)] if lists else []  # (list(): mypy types max by the return)


def shard_model(model: nn.Module, device: torch.device) -> None:
    """``fully_shard`` every decoder layer, then the root (embeddings, final norm, LM head:
    a tied LM head shares the embedding's parameter in the root group). Parameters move to
    ``device``; gradients are reduced as sums."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)


def load_sharded_policy(path: str | Path, config: Any, device: torch.device) -> Any:
    """The policy of ``path`` (float32, loaded on the CPU), sharded over the job's ranks. With
    ``config.lora_rank`` the adapters are injected first (``load_model``: the same ones, and
    the same random draws for fresh ones, as a single process), so each decoder layer's
    FSDP group holds its frozen base weights and its trainable adapters together."""
    from gspo_rl.learner.model.lora import load_model
    from gspo_rl.learner.model.policy import Policy, prepare_for_training

    model, peft = load_model(path, config)
    prepare_for_training(model, bool(config.gradient_checkpointing), lora=peft is not None)
    shard_model(model, device)
    return Policy(model, device, bf16_autocast=config.bf16_autocast, peft=peft)


def load_host_copy(path: str | Path, config: Any = None) -> tuple[nn.Module, Any]:
    """Rank 0's unsharded CPU model that pushes and checkpoints read from, and with
    ``config.lora_rank`` its ``PeftModel`` (``None`` otherwise): the model pushes, the
    ``PeftModel`` saves the adapter in PEFT's format. Under LoRA only the adapters are real
    (the frozen base, which pushes and checkpoints never read, is on the meta device).
    Loaded without drawing from the job's RNG (the adapters' values come from the first
    ``gather_full``)."""
    from gspo_rl.learner.model.lora import load_model

    with torch.random.fork_rng(devices=[]):
        if config is None or getattr(config, "lora_rank", None) is None:
            return load_model(path, config)
        return _adapters_only(path, config)


def _adapters_only(path: str | Path, config: Any) -> tuple[nn.Module, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from gspo_rl.learner.model.lora import apply_lora, base_source

    with torch.device("meta"):  # its config names the base as load_base's does
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base_source(path)),
                                                 dtype=torch.float32)
    peft = apply_lora(model, config)  # the names gather_full checks; values come from it
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if p.requires_grad:
                module._parameters[name] = nn.Parameter(torch.zeros_like(p, device="cpu"))
    return model, peft


def trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``model``'s parameters that train (all of them in full fine-tuning, the adapters under
    LoRA), in ``named_parameters`` order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


@torch.no_grad()
def gather_full(model: nn.Module, host: nn.Module | None) -> None:
    """Collective: every rank gathers each trainable parameter in turn; the rank with a
    ``host`` (rank 0) copies it there. Call on every rank, in the same order as the others.
    Frozen parameters (the base under LoRA) are never gathered: the host copy loaded them
    from the same source, and they never change."""
    from torch.distributed.tensor import DTensor

    params = trainable(model)
    dst = dict(trainable(host)) if host is not None else None
    if dst is not None:
        check_names([hf_name(n) for n, _ in params], list(dst))
    for name, p in params:
        full = p.full_tensor() if isinstance(p, DTensor) else p
        if dst is not None:
            dst[hf_name(name)].copy_(full)


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Collective: the full, name-keyed optimiser state on rank 0 (CPU), ``{}`` elsewhere."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=opts)


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                         osd: dict[str, Any], name_keyed: bool) -> None:
    """Collective under FSDP: load a full optimiser state (every rank passes the whole
    dict and keeps its shard). An id-keyed one is renamed first."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not name_keyed:
        osd = ids_to_names(osd, [n for n, _ in trainable(model)])
    optimizer.zero_grad(set_to_none=True)  # the loader initialises state with a 0-lr step
    set_optimizer_state_dict(model, optimizer, optim_state_dict=osd,
                             options=StateDictOptions(full_state_dict=True))


def grad_norm_value(norm: torch.Tensor) -> float:
    """``clip_grad_norm_`` returns a DTensor over sharded gradients: its global value."""
    from torch.distributed.tensor import DTensor

    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


@dataclass
class Share:
    """One rank's part of a minibatch under FSDP: its microbatches with trained tokens, and
    ``n_pad`` zero-weight passes on ``pad`` so every rank runs the same number."""

    micro: list[MicroBatch]
    n_pad: int
    pad: MicroBatch | None


def fsdp_share(mb: MiniBatch, owners: Sequence[int], rank: int, world: int) -> Share:
    """This rank's ``Share`` of ``mb`` given each microbatch's owner (the same plan on every
    rank, so no collective is needed to agree on the counts)."""
    valid = [(m, r) for m, r in zip(mb.micro, owners, strict=True) if m.n_valid > 0]
    counts = [sum(1 for _, r in valid if r == k) for k in range(world)]
    mine = [m for m, r in valid if r == rank]
    pad = min((m for m, _ in valid), key=lambda m: m.n_padded_tokens, default=None)
    return Share(mine, max(counts, default=0) - len(mine), pad)


def names_to_ids(osd: dict, names: Sequence[str]) -> dict:
    """A name-keyed full optimiser state (``gspo_rl.learner.parallel.fsdp``) numbered in ``names``
    order: the inverse of ``gspo_rl.learner.parallel.fsdp.ids_to_names``."""
    index = {n: i for i, n in enumerate(names)}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]
    return {"state": {index[n]: s for n, s in osd["state"].items()}, "param_groups": groups}
