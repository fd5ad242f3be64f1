"""Policy losses: GSPO, GSPO-token, GRPO and SAPO, as pure functions of tensors.

Notation (shape suffixes): ``B`` sequences in the batch, ``T`` token positions, ``G`` rollouts
in a group, ``N`` groups. ``logprobs_BT`` are log pi_theta of the tokens that were sampled,
``old_logprobs_BT`` log pi_old of the same tokens, ``mask_BT`` is 1 on trained tokens.

Every kind is aggregated "seq-mean-token-mean": the token mean inside each sequence, then the
mean over the sequences that have at least one trained token. The gradient is computed in
closed form and attached to ``logprobs`` by a small autograd function. Per-token log-ratios
are clamped to ``[-max_log_ratio, max_log_ratio]`` before ``exp`` (tokens outside the band get
no gradient); masked positions never reach values or gradients. SAPO has no hard clip: its
``clip_fraction`` is 0 and ``gate_mean`` is its health signal. Why each departure from the
papers: docs/reference/losses.md.

Stale data (the decoupled objective): ``old_logprobs`` is then the proximal policy (the weights
just before the update) and ``is_weights`` the truncated importance weight behaviour -> proximal
that ``decoupled_is_weights`` computes at the loss's level: one per sequence for "gspo" (the
geometric-mean ratio, ``[B]``), one per token for the others (``[B, T]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from gspo_rl.learner.algorithm.config import LossConfig


@dataclass
class LossOutput:
    """A scalar loss to minimise (the negative objective) and float metrics."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


class _AttachGrad(torch.autograd.Function):
    """Returns ``value`` in forward and ``grad_out * grad_BT`` as d/d``logprobs`` in backward."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        logprobs_BT: torch.Tensor,
        value: torch.Tensor,
        grad_BT: torch.Tensor,
    ) -> torch.Tensor:
        ctx.save_for_backward(grad_BT)
        ctx.input_dtype = logprobs_BT.dtype  # type: ignore[attr-defined]  # autograd's ctx: set at run time
        return value.clone()

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor, None, None]:
        (grad_BT,) = ctx.saved_tensors  # type: ignore[attr-defined]  # autograd's ctx: set at run time
        return (grad_BT * grad_out).to(ctx.input_dtype), None, None  # type: ignore[attr-defined]  # autograd's ctx: set at run time


def _check_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    is_weights: torch.Tensor | None,
    kind: str,
) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("mask", mask)):
        if t.shape != shape:
            raise ValueError(f"{name} must have the shape of logprobs {tuple(shape)}, "
                             f"got {tuple(t.shape)}")
    if advantages.shape not in (shape[:1], shape):
        raise ValueError(f"advantages must be [B]={tuple(shape[:1])} or [B, T]={tuple(shape)}, "
                         f"got {tuple(advantages.shape)}")
    if kind == "gspo" and advantages.dim() == 2:
        raise ValueError("kind='gspo' takes one advantage per sequence ([B]); per-token "
                         "advantages [B, T] need kind='gspo_token' (or 'grpo'/'sapo')")
    if is_weights is not None and is_weights.shape not in (shape[:1], shape):
        raise ValueError(f"is_weights must be [B]={tuple(shape[:1])} or [B, T]={tuple(shape)}, "
                         f"got {tuple(is_weights.shape)}")
    if kind == "gspo" and is_weights is not None and is_weights.dim() == 2:
        raise ValueError("kind='gspo' takes one importance weight per sequence ([B]): its "
                         "ratio is the sequence's")


def decoupled_is_weights(
    prox_BT: torch.Tensor, behavior_BT: torch.Tensor, mask_BT: torch.Tensor, kind: str,
    cap: float,
) -> torch.Tensor:
    """Truncated importance weights behaviour -> proximal at the level of ``kind``'s ratio.

    "gspo": ``min(exp(mean_t(prox - behavior)), cap)`` per sequence ``[B]`` over its trained
    tokens (1 for a sequence without any); the others: ``min(exp(prox_t - behavior_t), cap)``
    per token ``[B, T]`` (1 on untrained positions, whatever they hold). Clamped in log space:
    a huge ratio cannot overflow. Constants for the loss (no gradient flows through them).
    """
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    keep = mask_BT > 0
    log_cap = math.log(cap)
    diff = torch.where(keep, prox_BT - behavior_BT, 0.0)
    if kind == "gspo":
        n = keep.sum(-1)
        log_w = diff.sum(-1) / n.clamp(min=1)
        return torch.where(n > 0, log_w.clamp(max=log_cap).exp(), 1.0)
    return torch.where(keep, diff.clamp(max=log_cap).exp(), 1.0)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    is_weights: torch.Tensor | None = None,
) -> LossOutput:
    """The loss of ``config.kind`` for one batch; differentiable with respect to ``logprobs``.

    Args:
        logprobs: ``[B, T]`` log pi_theta of the sampled tokens (requires grad).
        old_logprobs: ``[B, T]`` log pi_old (behavior or recomputed proximal policy).
        advantages: ``[B]`` per sequence, or ``[B, T]`` per token (not for "gspo").
        mask: ``[B, T]``, 1 on trained tokens, 0 on padding and environment-written tokens.
        config: the objective and its constants.
        is_weights: optional weights treated as constants: ``[B]`` multiplies each sequence's
            objective, ``[B, T]`` (not for "gspo") each token's; the decoupled objective's
            truncated importance weights (``decoupled_is_weights``).
    """
    _check_inputs(logprobs, old_logprobs, advantages, mask, is_weights, config.kind)
    with torch.no_grad():  # nothing computed here joins the graph: no detach needed
        value, grad_BT, metrics = _loss_and_grad(logprobs, old_logprobs, advantages, mask,
                                                 config, is_weights)
    loss = _AttachGrad.apply(logprobs, value, grad_BT)
    return LossOutput(loss=loss, metrics=metrics)


def _loss_and_grad(
    logprobs_BT: torch.Tensor,
    old_BT: torch.Tensor,
    adv: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: LossConfig,
    is_weights_B: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Loss value, d loss / d logprobs ``[B, T]`` and metrics, in float32 (float64 if given)."""
    ft = torch.promote_types(logprobs_BT.dtype, torch.float32)
    keep_BT = mask_BT > 0
    lengths_B = keep_BT.sum(-1, dtype=ft)
    valid_B = lengths_B.clamp(max=1.0)  # 1.0 for sequences with a trained token, else 0.0
    len1_B = lengths_B.clamp(min=1.0)
    n_valid = valid_B.sum()
    n_seq = n_valid.clamp(min=1)
    # Masked positions become exactly 0 before any arithmetic: -inf/NaN padding stays inert.
    log_ratio_BT = torch.where(keep_BT, logprobs_BT.to(ft) - old_BT.to(ft), 0.0)
    # d clamp / d x is 0 outside the band. Always built: asking the device whether any token
    # left the band would cost a host synchronisation (two cheap passes do not).
    grad_ok_BT = keep_BT & (log_ratio_BT.abs() <= cfg.max_log_ratio)
    log_ratio_BT = log_ratio_BT.clamp_(-cfg.max_log_ratio, cfg.max_log_ratio)
    log_s_B = log_ratio_BT.sum(-1) / len1_B
    s_B = log_s_B.exp()
    # Per-sequence factor w_i / (N |y_i|) (negated: we minimise the negative objective).
    seq_scale_B = -valid_B / (len1_B * n_seq)
    tok_w_BT = None
    if is_weights_B is not None and is_weights_B.dim() == 1:
        seq_scale_B = seq_scale_B * is_weights_B.to(ft)
    elif is_weights_B is not None:  # per token; padding may hold anything
        tok_w_BT = torch.where(keep_BT, is_weights_B.to(ft), 0.0)

    if cfg.kind == "gspo":
        value, grad_BT, clip_lo_B, clip_hi_B = _gspo_terms(s_B, adv.to(ft), cfg, seq_scale_B,
                                                           lengths_B, grad_ok_BT)
        # Token counts of clipped sequences, without materialising [B, T] masks.
        clip_n = torch.stack([clip_lo_B, clip_hi_B]).to(ft) @ lengths_B
        extra: dict[str, torch.Tensor] = {}
    else:
        if adv.dim() == 1:
            adv_BT = adv.to(ft)[:, None].expand_as(log_ratio_BT)
        else:  # padding may hold anything, NaN included
            adv_BT = torch.where(keep_BT, adv.to(ft), 0.0)
        ratio_BT = s_B[:, None].expand_as(log_ratio_BT) if cfg.kind == "gspo_token" \
            else log_ratio_BT.exp()
        if tok_w_BT is not None:  # w_t A_t: the weight scales the token's objective
            adv_BT = adv_BT * tok_w_BT
        value, grad_BT, clip_lo_BT, clip_hi_BT, extra = _token_terms(
            ratio_BT, adv_BT, cfg, seq_scale_B, keep_BT, grad_ok_BT)
        clip_n = torch.stack([clip_lo_BT.sum(), clip_hi_BT.sum()]).to(ft)
    metrics = _metrics(s_B, log_s_B, valid_B, n_valid, lengths_B, clip_n, value, extra)
    return value, grad_BT, metrics


def _gspo_terms(
    s_B: torch.Tensor,
    adv_B: torch.Tensor,
    cfg: LossConfig,
    seq_scale_B: torch.Tensor,
    lengths_B: torch.Tensor,
    grad_ok_BT: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequence-level clipped objective; every token of a sequence gets the same gradient."""
    lo, hi = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high
    obj_B = torch.minimum(s_B * adv_B, s_B.clamp(lo, hi) * adv_B)
    clip_lo_B = (adv_B < 0) & (s_B < lo)
    clip_hi_B = (adv_B > 0) & (s_B > hi)
    active_B = ~(clip_lo_B | clip_hi_B)
    # sum_i scale_i * |y_i| * obj_i  ==  -(1/N) sum_i w_i obj_i
    value = (seq_scale_B * lengths_B * obj_B).sum()
    # d obj_i / d logprob_t = A_i s_i / |y_i|  (the 1/|y_i| is inside seq_scale_B)
    coef_B = seq_scale_B * active_B * adv_B * s_B  # (a bool factor promotes)
    grad_BT = torch.where(grad_ok_BT, coef_B[:, None], 0.0)  # no float copy of the mask
    return value, grad_BT, clip_lo_B, clip_hi_B


def _token_terms(
    ratio_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    cfg: LossConfig,
    seq_scale_B: torch.Tensor,
    keep_BT: torch.Tensor,
    grad_ok_BT: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token objectives (gspo_token, grpo, sapo) and their closed-form gradients.

    For gspo_token the ratio is ``sg(s_i) * pi/sg(pi)``: its value is ``s_i`` and its
    derivative with respect to token t's log-probability is ``s_i``; for grpo and sapo it is
    the token ratio ``r_t``, whose derivative is ``r_t``. Either way d ratio / d lp = ratio.
    """
    extra: dict[str, torch.Tensor] = {}
    if cfg.kind == "sapo":
        tau: torch.Tensor | float = cfg.tau_pos
        if cfg.tau_pos != cfg.tau_neg:
            # in the advantages' dtype (a scalar ``where`` would round tau to float32)
            tau = torch.full_like(adv_BT, cfg.tau_neg).masked_fill_(adv_BT > 0, cfg.tau_pos)
        sig_BT = (ratio_BT - 1.0).mul_(tau).sigmoid_()
        obj_BT = (sig_BT * adv_BT).mul_(4.0).div_(tau)
        slope_BT = sig_BT.sub_(sig_BT.square()).mul_(4.0)  # f'(r) = 4 sig (1 - sig); 1 at r = 1
        extra["gate_mean"] = (slope_BT * keep_BT).sum()  # a token sum: _metrics divides
        dobj_BT = slope_BT.mul_(adv_BT).mul_(ratio_BT)
        no_clip = torch.zeros((), dtype=torch.long, device=ratio_BT.device)
        clip_lo_BT, clip_hi_BT = no_clip, no_clip
    else:
        lo, hi = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high
        obj_BT = torch.minimum(ratio_BT * adv_BT, ratio_BT.clamp(lo, hi) * adv_BT)
        clip_lo_BT = (adv_BT < 0) & (ratio_BT < lo) & keep_BT
        clip_hi_BT = (adv_BT > 0) & (ratio_BT > hi) & keep_BT
        dobj_BT = (adv_BT * ratio_BT).masked_fill_(clip_lo_BT | clip_hi_BT, 0.0)
    # Every factor is finite (masked positions hold ratio 1 and a finite advantage), so the
    # masks can multiply.
    value = (seq_scale_B * obj_BT.mul_(keep_BT).sum(-1)).sum()
    del obj_BT
    grad_BT = dobj_BT.mul_(seq_scale_B[:, None]).mul_(grad_ok_BT)
    return value, grad_BT, clip_lo_BT, clip_hi_BT, extra


def _metrics(
    s_B: torch.Tensor,
    log_s_B: torch.Tensor,
    valid_B: torch.Tensor,
    n_valid: torch.Tensor,
    lengths_B: torch.Tensor,
    clip_n: torch.Tensor,
    value: torch.Tensor,
    extra: dict[str, torch.Tensor],
) -> dict[str, float]:
    """Health signals and the loss value. The device computes only sums (a few kernels: when
    the batch is small, a loss on a GPU costs what its kernel launches cost), read back in one
    transfer, the loss's only host synchronisation; the ratios are taken on the host.

    ``valid_B``: 1.0 for sequences with a trained token; ``clip_n``: clipped tokens, low and
    high; ``extra``: sums over the trained tokens, reported as means over them."""
    per_seq = torch.stack([s_B, log_s_B.abs()]) @ valid_B
    sums = torch.cat([per_seq, clip_n,
                      torch.stack([n_valid, lengths_B.sum(), value, *extra.values()])])
    (s_sum, abs_lr_sum, lo_n, hi_n, n_seqs, n_tok, loss, *rest) = sums.tolist()
    n_seq, tokens = max(n_seqs, 1.0), max(n_tok, 1.0)
    return {"clip_fraction": (lo_n + hi_n) / tokens, "clip_low_fraction": lo_n / tokens,
            "clip_high_fraction": hi_n / tokens, "ratio_mean": s_sum / n_seq,
            "abs_log_ratio_mean": abs_lr_sum / n_seq, "num_sequences": n_seqs,
            "num_tokens": n_tok, "loss": loss,
            **{k: v / tokens for k, v in zip(extra, rest, strict=True)}}


def group_advantages(
    rewards: torch.Tensor | list[float] | list[list[float]],
    eps: float = 1e-6,
    scale: bool = True,
) -> torch.Tensor:
    """Group-relative advantages ``(r - mean) / (std + eps)`` for rewards ``[G]`` or ``[N, G]``.

    The std is the population standard deviation (divide by G, ``unbiased=False``), so the
    advantages of a group have mean 0 and root-mean-square 1 (up to eps) whatever G is; a
    group of two with rewards 0 and 1 gets -1 and +1. A group whose rewards are all equal gets
    all-zero advantages. With ``scale=False`` the rewards are only centred (Dr. GRPO style).
    """
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if r.dim() not in (1, 2) or r.shape[-1] == 0:
        raise ValueError(f"rewards must be [G] or [N, G] with G >= 1, got {tuple(r.shape)}")
    if not torch.isfinite(r).all():
        raise ValueError("rewards must be finite")
    centred = r - r.mean(dim=-1, keepdim=True)
    if not scale:
        return centred
    std = r.std(dim=-1, unbiased=False, keepdim=True)
    return centred / (std + eps)
