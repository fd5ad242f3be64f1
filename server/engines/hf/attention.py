"""The hf engine's attention: transformers' SDPA attention without copying grouped KV heads.

With grouped-query attention (fewer key/value heads than query heads: Qwen, Llama, the tiny
test model) transformers' "sdpa" attention repeats the key/value heads (``repeat_kv``: a copy
of the layer's whole KV cache, in every layer at every step) whenever it passes SDPA an
attention mask. The engine's batch needs a mask whenever it holds padding: rows that joined
at different steps or have prompts of different lengths, i.e. nearly always under continuous
batching. PyTorch's SDPA takes grouped heads as they are (``enable_gqa``) with a mask too.
This attention ("gspo_sdpa") does that on CPU, where it gives the same outputs, and hands
every other case (no mask, no grouping, another device) to transformers' own function;
masks are built as for "sdpa". Measured: see BENCHMARKS.md ("Rollout server").

On CUDA, ``step_backends`` keeps SDPA off cuDNN attention during the engine's steps, whose
masked attention changes shape at every step (``gspo_rl.contract.attention`` says why).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from gspo_rl.contract.attention import masked_sdpa_backends

NAME = "gspo_sdpa"


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
              scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any
              ) -> tuple[torch.Tensor, None]:
    """Shapes as transformers' attention functions: query (B, H, Q, D), key and value
    (B, H_kv, T, D); returns (B, Q, H, D)."""
    plain = (attention_mask is None or query.device.type != "cpu"
             or getattr(module, "num_key_value_groups", 1) <= 1
             or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, is_causal=is_causal,
                                      **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=False, enable_gqa=True)  # with a mask, causality is in the mask
    return out.transpose(1, 2).contiguous(), None


step_backends = masked_sdpa_backends  # the SDPA backends an engine step may use


def register() -> str:
    """Makes ``NAME`` a valid ``attn_implementation``; returns it."""
    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
