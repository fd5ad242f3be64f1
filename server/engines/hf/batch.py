"""Tensor helpers of the transformers engine: per-row sampling and KV-cache surgery.

Shape letters: B rows of the running batch, V vocabulary, T cache columns, H heads, D head dim.

The batch is left-aligned by padding: every row's cache ends at the last column, rows that
joined later or have shorter prompts carry masked (zero) columns on the left. Position ids come
from each row's count of real tokens, so padding changes neither positions nor (beyond float
rounding) log-probabilities. No I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from gspo_rl.contract.sampling_dist import keep_mask, truncating
from gspo_rl.server.engines.base import SamplingParams


@dataclass
class StepSample:
    """What one sampling step produced for each row."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]] | None]
    token_ids_B: torch.Tensor  # the same token ids, on the logits' device


def processed_logprobs(logp_BV: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """The distribution each row samples from: ``log_softmax(z / T)`` cut by the row's top-k /
    top-p (``gspo_rl.contract.sampling_dist.keep_mask``, vLLM's rule) and renormalised. Rows without
    a cut are returned as they are."""
    vocab = logp_BV.shape[-1]
    if all(p.top_p >= 1.0 and not 0 < p.top_k < vocab for p in params):
        return logp_BV  # nothing to cut (checked in Python: no tensors for the common case)
    top_p_B = torch.tensor([p.top_p for p in params], device=logp_BV.device)
    top_k_B = torch.tensor([p.top_k for p in params], device=logp_BV.device)
    rows_B = truncating(top_p_B, top_k_B, vocab) & torch.tensor(
        [p.temperature > 0 for p in params], device=logp_BV.device)
    if not bool(rows_B.any()):
        return logp_BV
    cut_RV = logp_BV[rows_B]
    keep_RV = keep_mask(cut_RV, top_p_B[rows_B], top_k_B[rows_B])
    cut_RV = torch.log_softmax(cut_RV.masked_fill(~keep_RV, float("-inf")), dim=-1)
    out_BV = logp_BV.clone()
    out_BV[rows_B] = cut_RV
    return out_BV


def sample_rows(
    logits_BV: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator],
) -> StepSample:
    """Sample one token per row with its own parameters and generator.

    The reported log-probability (and the top log-probabilities) are those of the
    distribution actually sampled from: ``log_softmax(logits / T)``, cut by top-k / top-p and
    renormalised when those are on (as vLLM's ``processed_logprobs``); greedy rows (T = 0)
    report ``log_softmax(logits)``. Sampling uses the exponential-race form of Gumbel-max
    (argmax p_i / E_i, E_i ~ Exp(1) from the row's seeded generator), so a seed gives the
    same token even if batching perturbs logits by rounding. Each row's noise comes from its
    own generator (one draw per row); the rest is a handful of whole-batch operations.
    """
    logits_BV = logits_BV.float()
    temps_B = torch.tensor(
        [p.temperature if p.temperature > 0 else 1.0 for p in params], device=logits_BV.device
    )
    logp_BV = processed_logprobs(torch.log_softmax(logits_BV / temps_B[:, None], dim=-1),
                                 params)
    greedy = [p.temperature == 0 for p in params]
    noise_BV = torch.ones_like(logp_BV) if any(greedy) else torch.empty_like(logp_BV)
    for row, (is_greedy, gen) in enumerate(zip(greedy, generators, strict=True)):
        if not is_greedy:
            noise_BV[row].exponential_(generator=gen)
    idx_B = torch.argmax(logp_BV - noise_BV.log_(), dim=-1)
    if any(greedy):
        greedy_B = torch.tensor(greedy, device=logits_BV.device)
        idx_B = torch.where(greedy_B, torch.argmax(logits_BV, dim=-1), idx_B)
    chosen_B = logp_BV.gather(-1, idx_B[:, None]).squeeze(-1)
    tops: list[list[tuple[int, float]] | None] = []
    for row, p in enumerate(params):
        if p.top_logprobs <= 0:
            tops.append(None)
            continue
        vals, ids = torch.topk(logp_BV[row], min(p.top_logprobs, logp_BV.shape[-1]))
        # Tokens the cut removed (-inf) are not among the alternatives, as in JSON they can't be
        tops.append([(i, v) for i, v in zip(ids.tolist(), vals.tolist(), strict=True)
                     if v > float("-inf")])
    return StepSample(idx_B.tolist(), chosen_B.tolist(), tops, idx_B)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded input ids, attention mask and position ids (from the mask) of prompts."""
    width = max(len(p) for p in prompts)
    ids_BT = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask_BT = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids_BT[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
        mask_BT[row, width - len(prompt):] = 1
    pos_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
    return ids_BT.to(device), mask_BT.to(device), pos_BT.to(device)


def _layers(cache: DynamicCache) -> list:
    layers = getattr(cache, "layers", None)
    if layers is None or any(not hasattr(layer, "keys") for layer in layers):
        raise TypeError("expected a DynamicCache of full-attention layers")
    return layers


def select_rows(cache: DynamicCache, rows_B: torch.Tensor) -> None:
    """Keep only the given batch rows of the cache (in place)."""
    for layer in _layers(cache):
        layer.keys = layer.keys[rows_B]
        layer.values = layer.values[rows_B]


def drop_left_columns(cache: DynamicCache, n: int) -> None:
    """Drop the first ``n`` cache columns (in place): columns masked out in every row."""
    if n <= 0:
        return
    for layer in _layers(cache):
        layer.keys = layer.keys[:, :, n:]
        layer.values = layer.values[:, :, n:]


def _pad_left(x_BHTD: torch.Tensor, n: int) -> torch.Tensor:
    if n == 0:
        return x_BHTD
    b, h, _, d = x_BHTD.shape
    return torch.cat([x_BHTD.new_zeros((b, h, n, d)), x_BHTD], dim=2)


def merge(
    cache_a: DynamicCache, mask_a: torch.Tensor, cache_b: DynamicCache, mask_b: torch.Tensor
) -> torch.Tensor:
    """Append the rows of ``cache_b`` to ``cache_a`` (in place), left-padding the shorter one
    with masked zero columns. Returns the merged attention mask."""
    ta, tb = mask_a.shape[1], mask_b.shape[1]
    width = max(ta, tb)
    for la, lb in zip(_layers(cache_a), _layers(cache_b), strict=True):
        la.keys = torch.cat([_pad_left(la.keys, width - ta), _pad_left(lb.keys, width - tb)])
        la.values = torch.cat(
            [_pad_left(la.values, width - ta), _pad_left(lb.values, width - tb)]
        )
    return torch.cat([
        torch.nn.functional.pad(mask_a, (width - ta, 0)),
        torch.nn.functional.pad(mask_b, (width - tb, 0)),
    ])
