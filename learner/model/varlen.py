"""Variable-length causal attention for packed rows, without the flash-attn package.

The learner packs a microbatch's sequences end to end in one ``[1, N]`` row
(``gspo_rl.learner.data.packing``); attention must then stay inside each sequence. This module
calls PyTorch's bundled FlashAttention-2 variable-length kernels
(``aten::_flash_attention_forward`` with ``cum_seq_q``), as ``NAME``, a transformers attention
implementation:

- CUDA, bf16/fp16: the flash varlen kernels, forward and backward, grouped KV heads as they
  are;
- elsewhere (the CPU, float32): one causal SDPA per sequence, exact; the tests' reference.

The policy passes ``cu_seq_lens_q`` / ``max_length_q`` through the model's forward, with no
attention mask; a call without offsets (a padded batch) goes to transformers' sdpa attention.

Notation: ``N`` packed tokens, ``H`` query heads, ``Hk`` key/value heads, ``D`` head size,
``S`` sequences (``cu`` holds ``S + 1`` offsets). Why not flex attention:
docs/design/learner-model.md.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "gspo_varlen"
_FLASH_DTYPES = (torch.bfloat16, torch.float16)


class _FlashVarlen(torch.autograd.Function):
    """Causal FlashAttention-2 over packed sequences: ``[N, H, D]`` in and out."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, q_NHD: torch.Tensor, k_NHD: torch.Tensor,
        v_NHD: torch.Tensor, cu_S1: torch.Tensor, max_len: int, scale: float | None,
    ) -> torch.Tensor:
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q_NHD, k_NHD, v_NHD, cu_S1, cu_S1, max_len, max_len, 0.0, True, False,
            scale=scale)
        ctx.save_for_backward(q_NHD, k_NHD, v_NHD, out, lse, cu_S1, rng, unused)
        ctx.max_len, ctx.scale = max_len, scale  # type: ignore[attr-defined]  # autograd's ctx: set at run time
        return out

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_NHD: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:
        q, k, v, out, lse, cu, rng, unused = ctx.saved_tensors  # type: ignore[attr-defined]  # autograd's ctx: set at run time
        m = ctx.max_len  # type: ignore[attr-defined]  # autograd's ctx: set at run time
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad_NHD.contiguous(), q, k, v, out, lse, cu, cu, m, m, 0.0, True, rng, unused,
            scale=ctx.scale)  # type: ignore[attr-defined]  # autograd's ctx: set at run time
        return dq, dk, dv, None, None, None


def reference_varlen(q_NHD: torch.Tensor, k_NHD: torch.Tensor, v_NHD: torch.Tensor,
                     cu_S1: torch.Tensor, scale: float | None) -> torch.Tensor:
    """One causal SDPA per sequence (exact, differentiable, any device and dtype)."""
    bounds = cu_S1.tolist()
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if b == a:
            continue
        q, k, v = (x[a:b].transpose(0, 1)[None] for x in (q_NHD, k_NHD, v_NHD))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                           enable_gqa=k.shape[1] != q.shape[1])
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs, dim=0)


@torch.compiler.disable  # compiled decoder layers (``compile``) call it eagerly
def varlen_causal(q_NHD: torch.Tensor, k_NHD: torch.Tensor, v_NHD: torch.Tensor,
                  cu_S1: torch.Tensor, max_len: int, scale: float | None) -> torch.Tensor:
    """Causal attention within each packed sequence: ``[N, H, D]``."""
    if q_NHD.is_cuda and q_NHD.dtype in _FLASH_DTYPES:
        return _FlashVarlen.apply(q_NHD.contiguous(), k_NHD.contiguous(), v_NHD.contiguous(),
                                  cu_S1.to(q_NHD.device, torch.int32), max_len, scale)
    return reference_varlen(q_NHD, k_NHD, v_NHD, cu_S1, scale)


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
              scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function shapes: query ``(1, H, N, D)``, key and value
    ``(1, Hk, N, D)``; returns ``(1, N, H, D)``."""
    cu, max_len = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if cu is None or max_len is None:  # not packed: a padded batch, transformers' sdpa
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    if query.shape[0] != 1 or attention_mask is not None:
        raise ValueError(f"the {NAME!r} attention takes one packed row "
                         "(gspo_rl.learner.data.packing) with sequence offsets and no attention "
                         "mask")
    for unsupported in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"the {NAME!r} attention has no {unsupported}: use packing = "
                             "'off' (padded sdpa) for this model")
    if dropout:
        raise ValueError(f"the {NAME!r} attention has no dropout (the learner disables it)")
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))
    return varlen_causal(q, k, v, cu, int(max_len), scaling)[None], None


def _mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """No mask for a row without padding (packed: the offsets are the mask), else sdpa's."""
    if kwargs.get("attention_mask") is None:
        return None
    return sdpa_mask(*args, **kwargs)


def register() -> str:
    """Makes ``NAME`` a valid ``attn_implementation``."""
    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, _mask)
    return NAME
