"""The distribution a sampler actually draws from under top-k / top-p, as pure torch functions.

Notation: ``N`` rows (token positions), ``V`` vocabulary. A row's sampling parameters are its
temperature ``T``, ``top_p`` (1: off) and ``top_k`` (<= 0 or >= V: off).

With truncation on, the sampler draws from ``q = softmax(z / T)`` restricted to a kept set
``K`` and renormalised, so the behaviour log-probability of a token is

    log q(y) = z_y / T - logsumexp_{j in K} z_j / T

and an importance ratio is only unbiased if the learner computes ``pi_theta`` and ``pi_old``
under the same rule. ``keep_mask`` decides ``K`` exactly as vLLM does
(``vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p_pytorch``, the CPU path), and the
transformers engine (``gspo_rl.server.engines.hf.batch``) samples with this same function, so all
three agree on ties and on the nucleus boundary:

1. Temperature first: both cuts act on ``z / T``.
2. Top-k keeps every token whose scaled logit is ``>=`` the k-th largest (ties with the k-th
   are kept, so ``K`` may hold more than k tokens).
3. Top-p, on what top-k kept: sort ascending, cumulative probability from the least likely
   token; drop a token when that sum (itself included) is ``<= 1 - top_p``; the most likely
   token is always kept.

One departure, in the learner only (``sampled_logprobs``): the kept set is ``K`` *plus the
target token*. At ``theta = theta_old`` this changes nothing (the sampler drew the token, so it
is in ``K``). After an update a token may fall just outside the new nucleus; its exact
probability would be 0 (log-prob ``-inf``), which would zero the whole sequence's GSPO ratio
and leave no gradient. Keeping it gives the log-probability under the nearest distribution
that can produce the token, finite and smooth in theta. ``K`` itself is a step function of the
logits: no gradient flows through the choice of ``K``, only through the logits in it.

A limit no implementation removes: a token whose scaled logit (or nucleus mass) sits within
float rounding of the cut (gaps of ~1e-6) can be kept by the sampler's forward and dropped by
the learner's (different kernels, batching), or the other way round; the log-probs of that
position then differ by the token's share of the kept mass. On the tiny model this hit 1 token
in ~500 at top_k = 20 (0.03 nats); the sequence-level GSPO ratio moved by 1e-4.
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
