"""bf16 parameters with float32 master weights held for the optimizer.

Autocast keeps float32 weights and casts each of them to bf16 in every forward and again in
backward: on a small model those casts were 16% of a step's GPU time. Here the model itself
is bf16 (its matmuls read bf16 weights directly, activations are bf16) and the optimizer steps
float32 *master* copies:

1. after each microbatch's backward, the bf16 gradients are added into float32 master
   gradients (``accumulate_grads``) and the bf16 ones dropped, so accumulation over
   microbatches and the data-parallel sum happen in float32;
2. clipping and AdamW work on the masters (their moments are float32 too);
3. ``copy_to_model`` rounds the updated masters into the bf16 parameters.

Rounding the weights to bf16 only when they are used keeps small updates (lr 1e-6 on weights
of size ~1e-2 is below bf16's resolution) from vanishing, which plain bf16 weights would do.
Tied parameters (input and output embeddings) are one parameter, so one master.
"""

from __future__ import annotations

import torch
from torch import nn


class MasterWeights:
    """float32 masters of a model's trainable parameters, which are cast to ``dtype``."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [nn.Parameter(p.detach().to(torch.float32, copy=True))
                       for p in self.params]
        model.to(dtype)  # in place: the same Parameter objects, ties kept

    @torch.no_grad()
    def accumulate_grads(self) -> None:
        """Add the model's gradients into the float32 master gradients and free them."""
        for p, m in zip(self.params, self.master, strict=True):
            if p.grad is None:
                continue
            if m.grad is None:
                m.grad = p.grad.to(torch.float32)
            else:
                m.grad.add_(p.grad)
            p.grad = None

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Round the masters into the model's parameters."""
        torch._foreach_copy_(self.params, self.master)  # type: ignore[arg-type]  # torch wants list[Tensor] (invariant): Parameters are Tensors

    def state(self) -> list[torch.Tensor]:
        """The masters on the CPU (for a checkpoint: the bf16 model alone loses precision)."""
        return [m.detach().to("cpu", copy=True) for m in self.master]

    @torch.no_grad()
    def load_state(self, tensors: list[torch.Tensor]) -> None:
        """Restore masters saved by ``state`` (same parameter order), then the model."""
        if len(tensors) != len(self.master):
            raise ValueError(f"{len(tensors)} master tensors for {len(self.master)} parameters")
        for m, t in zip(self.master, tensors, strict=True):
            m.copy_(t)
        self.copy_to_model()
