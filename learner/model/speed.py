"""How the learner runs fast on a GPU: one decision per lever, taken once when the trainer is
built (``plan_speed``) and applied to the policy (``apply_speed``).

Levers and their "auto" rules (``LearnerConfig``: ``param_dtype``, ``packing``,
``gradient_checkpointing``, ``compile``):

- bf16 parameters with float32 master weights (``gspo_rl.learner.model.precision``): on CUDA
  with compute capability 8.0 or newer (``ampere_or_newer``), unless FSDP-sharded; float32 on
  the CPU (exact) and on older GPUs.
- Packing with variable-length attention (flash-attn's when installed, else
  ``gspo_rl.learner.model.varlen``): on CUDA with bf16 parameters, not under FSDP; off on CPU.
- Fused AdamW: on CUDA.
- Gradient checkpointing: on when one microbatch's estimated activations, with the training
  state, would exceed 80% of the GPU's memory (``needs_checkpointing``); never by "auto" on
  the CPU or under FSDP.
- ``torch.compile`` of each decoder layer (``dynamic=True``): on CUDA with bf16 parameters;
  the varlen attention stays eager; a graph that fails to compile runs eagerly.

Measurements and history: docs/design/learner-model.md.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gspo_rl.learner.model import varlen

log = logging.getLogger(__name__)

# Fraction of the GPU's memory a step may plan for; the rest is the allocator's slack.
_MEMORY_FRACTION = 0.8


@dataclass(frozen=True)
class SpeedPlan:
    """The levers for one trainer (see the module doc)."""

    param_dtype: torch.dtype
    packing: bool
    attn_implementation: str | None  # None: keep the model's
    gradient_checkpointing: bool | None  # None: keep the model's
    fused_adamw: bool
    compile: bool


def pick_attention(device: torch.device, packing: bool, dtype: torch.dtype) -> str | None:
    """A variable-length attention for packed rows on CUDA; ``None`` keeps the model's.
    flash-attention-2 when the flash-attn package is installed and the weights are bf16 (its
    kernels take no float32), else ``gspo_rl.learner.model.varlen`` (PyTorch's own FlashAttention-2
    varlen kernels for bf16; one SDPA per sequence for float32)."""
    if device.type != "cuda" or not packing:
        return None
    if dtype == torch.bfloat16 and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return varlen.register()


def activation_bytes_per_token(model_config: Any, dtype_bytes: int) -> int:
    """Activations kept for backward per token by all decoder layers, a deliberately generous
    estimate: ~16 hidden-size and ~5 intermediate-size vectors per layer (norm inputs and
    outputs, q/k/v/o and attention outputs, the MLP's gate, up, activation and product)."""
    h = int(model_config.hidden_size)
    inter = int(getattr(model_config, "intermediate_size", 4 * h))
    return int(model_config.num_hidden_layers) * dtype_bytes * (16 * h + 5 * inter)


def needs_checkpointing(model_config: Any, n_params: int, micro_batch_tokens: int,
                        bf16_params: bool, device_bytes: int,
                        n_trainable: int | None = None) -> bool:
    """Whether a microbatch of ``micro_batch_tokens`` would not fit without checkpointing.

    Fixed bytes per trainable parameter: bf16 weight and gradient, float32 master, master
    gradient and two AdamW moments (20); float32 throughout (16) otherwise. A frozen one (the
    base under LoRA; ``n_trainable`` of the ``n_params`` train) holds its weight only."""
    trainable = n_params if n_trainable is None else n_trainable
    fixed = trainable * (20 if bf16_params else 16) + \
        (n_params - trainable) * (2 if bf16_params else 4)
    acts = micro_batch_tokens * activation_bytes_per_token(model_config, 2 if bf16_params else 4)
    return fixed + acts > _MEMORY_FRACTION * device_bytes


def ampere_or_newer(device: torch.device) -> bool:
    """Compute capability 8.0 or newer (A100, H100, RTX 30xx on): native bf16 matrix units
    and FlashAttention-2 (``gspo_rl.learner.model.varlen``). Older GPUs keep float32 weights, padded
    batches and eager layers under "auto". Without a visible GPU (planning only): assumed."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return True
    return torch.cuda.get_device_capability(device) >= (8, 0)


def plan_speed(config: Any, model: nn.Module, device: torch.device, sharded: bool) -> SpeedPlan:
    """Resolve ``config``'s "auto" levers for ``model`` on ``device``."""
    cuda = device.type == "cuda"
    dtype_name = config.param_dtype
    if dtype_name == "auto":
        dtype_name = "bfloat16" if cuda and not sharded and ampere_or_newer(device) \
            else "float32"
    if dtype_name == "bfloat16" and sharded:
        raise ValueError("param_dtype bfloat16 is not supported with FSDP2 sharding (its "
                         "shards stay float32); use bf16_autocast there")
    dtype = torch.bfloat16 if dtype_name == "bfloat16" else torch.float32
    # FSDP-sharded policies keep the padded logits path (gspo_rl.learner.model.policy), so no
    # packing there. "auto" packs bf16 on CUDA (flash varlen kernels); float32 there would attend
    # one sequence at a time.
    packing = not sharded and (config.packing == "on" or (
        config.packing == "auto" and cuda and dtype == torch.bfloat16))
    ckpt = config.gradient_checkpointing
    if ckpt is None and cuda and not sharded:
        n_params = sum(p.numel() for p in model.parameters())
        n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = torch.cuda.get_device_properties(device).total_memory
        ckpt = needs_checkpointing(model.config, n_params, config.micro_batch_tokens,
                                   dtype == torch.bfloat16, total, n_trainable)
    compile_on = config.compile == "on" or (
        config.compile == "auto" and cuda and not sharded and dtype == torch.bfloat16)
    return SpeedPlan(param_dtype=dtype, packing=packing,
                     attn_implementation=pick_attention(device, packing, dtype),
                     gradient_checkpointing=ckpt, fused_adamw=cuda, compile=compile_on)


def apply_speed(policy: Any, plan: SpeedPlan) -> None:
    """Set the policy's attention, checkpointing, packing and compilation per ``plan`` (the
    parameter dtype is the trainer's: it owns the master weights)."""
    model = policy.model
    if plan.attn_implementation is not None:
        model.set_attn_implementation(plan.attn_implementation)
    if plan.gradient_checkpointing is True:
        model.gradient_checkpointing_enable()
        if getattr(policy, "peft", None) is not None:  # LoRA: the frozen embedding's output
            model.enable_input_require_grads()  # must carry grad into checkpointed layers
    elif plan.gradient_checkpointing is False and getattr(model, "is_gradient_checkpointing",
                                                          False):
        model.gradient_checkpointing_disable()
    policy.packing = plan.packing
    if plan.compile:
        # A graph that fails to compile (a backend missing on this install, say) runs
        # eagerly with a logged warning instead of stopping the learner.
        torch._dynamo.config.suppress_errors = True
        log.info("compiling the decoder layers at their first calls: the first training "
                 "steps take tens of seconds longer (compile = \"off\" skips this)")
        base = getattr(model, model.base_model_prefix)
        for layer in base.layers:  # in place: parameter names unchanged
            layer.compile(dynamic=True)
    log.info("learner speed plan: %s", plan)
