"""The distribution a sampler actually draws from under top-k / top-p, as pure torch functions.

Notation: ``N`` rows (token positions), ``V`` vocabulary. A row's sampling parameters are its
temperature ``T``, ``top_p`` (1: off) and ``top_k`` (<= 0 or >= V: off). With truncation on,
the sampler draws from ``softmax(z / T)`` restricted to a kept set ``K`` and renormalised:
``log q(y) = z_y / T - logsumexp_{j in K} z_j / T``.

``keep_mask`` decides ``K`` exactly as vLLM does (its CPU path), and the transformers engine
samples with it: temperature first; top-k keeps every token whose scaled logit is ``>=`` the
k-th largest (ties kept); top-p, on what top-k kept, drops a token when the cumulative
probability from the least likely one (itself included) is ``<= 1 - top_p``; the most likely
token is always kept. The learner (``sampled_logprobs``) keeps ``K`` plus the target token, so
a token that fell just outside the new nucleus keeps a finite log-probability. Why, and the
limit no implementation removes: docs/design/sampling-distribution.md.
"""

from __future__ import annotations

import torch

# Row chunk of ``sampled_logprobs``: about 2**22 float32 elements (16 MiB) at a time; each
# chunk keeps its scaled logits and a masked copy for backward.
_CHUNK_ELEMS = 2**22


def truncating(top_p_N: torch.Tensor, top_k_N: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bool ``[N]``: the rows whose top-p or top-k actually cuts the distribution."""
    return (top_p_N < 1.0) | ((top_k_N > 0) & (top_k_N < vocab))


@torch.no_grad()
def keep_mask(scaled_NV: torch.Tensor, top_p_N: torch.Tensor,
              top_k_N: torch.Tensor) -> torch.Tensor:
    """Bool ``[N, V]``: the tokens top-k then top-p keep, given temperature-scaled logits
    (vLLM's rule, see the module docstring). Rows with both cuts off keep everything."""
    n, v = scaled_NV.shape
    sorted_NV, order_NV = scaled_NV.float().sort(dim=-1, descending=False)
    k_N = top_k_N.to(device=scaled_NV.device, dtype=torch.long)
    k_N = torch.where((k_N <= 0) | (k_N >= v), torch.full_like(k_N, v), k_N)
    kth_N1 = sorted_NV.gather(1, (v - k_N)[:, None])
    sorted_NV = sorted_NV.masked_fill(sorted_NV < kth_N1, float("-inf"))
    p_N = top_p_N.to(device=scaled_NV.device, dtype=torch.float32)
    cum_NV = sorted_NV.softmax(dim=-1).cumsum(dim=-1)
    drop_NV = (cum_NV <= (1.0 - p_N)[:, None]) & (p_N < 1.0)[:, None]
    drop_NV[:, -1] = False  # at least one
    keep_sorted_NV = (sorted_NV > float("-inf")) & ~drop_NV
    return torch.empty_like(keep_sorted_NV).scatter_(1, order_NV, keep_sorted_NV)


def sampled_logprobs(
    logits_NV: torch.Tensor,
    token_ids_N: torch.Tensor,
    temperature_N: torch.Tensor,
    top_p_N: torch.Tensor,
    top_k_N: torch.Tensor,
) -> torch.Tensor:
    """Float32 ``[N]`` (float64 for float64 logits): ``log q(token)`` under the truncated,
    renormalised distribution, the kept set widened by the target (module docstring).
    Differentiable in ``logits_NV``; rows without truncation give ``log_softmax(z / T)``."""
    n, v = logits_NV.shape
    ft = torch.promote_types(logits_NV.dtype, torch.float32)
    dev = logits_NV.device
    temperature_N = temperature_N.to(dev, ft)
    step = max(1, _CHUNK_ELEMS // max(v, 1))
    parts = []
    for a in range(0, n, step):
        x_CV = logits_NV[a:a + step].to(ft) / temperature_N[a:a + step, None]
        tgt_C1 = token_ids_N[a:a + step, None].to(dev)
        keep_CV = keep_mask(x_CV.detach(), top_p_N[a:a + step], top_k_N[a:a + step])
        keep_CV.scatter_(1, tgt_C1, True)
        lse_C = torch.logsumexp(x_CV.masked_fill(~keep_CV, float("-inf")), dim=-1)
        parts.append(x_CV.gather(1, tgt_C1).squeeze(1) - lse_C)
    return torch.cat(parts) if parts else logits_NV.new_zeros(0, dtype=ft)
