"""The decoupled off-policy objective (clip around the proximal policy, truncated importance
weight behaviour -> proximal at the loss's level), pinned against a direct implementation: a
loop over sequences and tokens in float64, differentiated by autograd."""

from __future__ import annotations

import math

import pytest
import torch

from gspo_rl.learner.algorithm.config import LossConfig
from gspo_rl.learner.algorithm.losses import decoupled_is_weights, policy_loss
from gspo_rl.learner.config import LearnerConfig

KINDS = ["gspo", "gspo_token", "grpo", "sapo"]


def _clipped(r: torch.Tensor, a: float, cfg: LossConfig) -> torch.Tensor:
    return torch.minimum(r * a, r.clamp(1 - cfg.eps_low, 1 + cfg.eps_high) * a)


def _sapo(r: torch.Tensor, a: float, cfg: LossConfig) -> torch.Tensor:
    tau = cfg.tau_pos if a > 0 else cfg.tau_neg
    return 4.0 / tau * torch.sigmoid(tau * (r - 1.0)) * a


def direct_decoupled(lp, prox, beh, adv, mask, cfg: LossConfig, cap: float) -> torch.Tensor:
    """-(1/N) sum_i J_i over the N sequences with a trained token, where for gspo
    J_i = min(exp(mean_t(prox - beh)), C) * min(s_i A_i, clip(s_i) A_i) with
    s_i = exp(mean_t(lp - prox)), and for the per-token kinds
    J_i = mean_t min(exp(prox_t - beh_t), C) * f(r_t, A_t), r_t = exp(lp_t - prox_t) (grpo,
    sapo) or sg(s_i) exp(lp_t - sg(lp_t)) (gspo_token)."""
    objectives = []
    for i in range(lp.shape[0]):
        toks = [t for t in range(lp.shape[1]) if mask[i, t] > 0]
        if not toks:
            continue
        n = len(toks)
        s = torch.exp(sum(lp[i, t] - prox[i, t] for t in toks) / n)
        if cfg.kind == "gspo":
            w = min(math.exp(float(sum(prox[i, t] - beh[i, t] for t in toks)) / n), cap)
            objectives.append(w * _clipped(s, float(adv[i]), cfg))
            continue
        total = 0.0
        for t in toks:
            a = float(adv[i, t] if adv.dim() == 2 else adv[i])
            w = min(math.exp(float(prox[i, t] - beh[i, t])), cap)
            if cfg.kind == "gspo_token":
                r = s.detach() * torch.exp(lp[i, t] - lp[i, t].detach())
            else:
                r = torch.exp(lp[i, t] - prox[i, t])
            f = _sapo(r, a, cfg) if cfg.kind == "sapo" else _clipped(r, a, cfg)
            total = total + w * f
        objectives.append(total / n)
    return -sum(objectives) / len(objectives)


def _batch(kind: str, spread: float, stale: float, seed: int = 0):
    """Behaviour log-probs ``stale`` (per-token noise scale) away from the proximal ones, the
    current ones ``spread`` away from the proximal ones; ragged lengths, one empty row."""
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 6
    prox = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lp = prox + torch.randn(B, T, generator=g, dtype=torch.float64) * spread
    beh = prox + torch.randn(B, T, generator=g, dtype=torch.float64) * stale
    mask = torch.zeros(B, T, dtype=torch.float64)
    for i, n in enumerate((6, 2, 4, 0, 1)):
        mask[i, :n] = 1
    beh = torch.where(mask > 0, beh, torch.nan)  # untrained positions may hold anything
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    if kind != "gspo":
        adv = adv[:, None] * (0.5 + torch.rand(B, T, generator=g, dtype=torch.float64))
    return lp, prox, beh, adv, mask


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("spread", [1e-5, 2e-4, 0.3])
@pytest.mark.parametrize("stale", [0.05, 1.5])
def test_matches_the_direct_implementation(kind, spread, stale):
    lp, prox, beh, adv, mask = _batch(kind, spread, stale, seed=int(spread * 1e5) + 7)
    cfg, cap = LossConfig(kind=kind), 1.5
    w = decoupled_is_weights(prox, beh, mask, kind, cap)
    assert w.shape == ((5,) if kind == "gspo" else (5, 6))
    a = lp.clone().requires_grad_(True)
    b = lp.clone().requires_grad_(True)
    out = policy_loss(a, prox, adv, mask, cfg, is_weights=w)
    ref = direct_decoupled(b, prox, beh, adv, mask, cfg, cap)
    out.loss.backward()
    ref.backward()
    torch.testing.assert_close(out.loss, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-12)
    if stale > 1:  # the comparison covered truncated weights
        assert bool((w[mask.sum(-1) > 0] >= cap).any()) if kind == "gspo" \
            else bool((w[mask > 0] >= cap).any())


@pytest.mark.parametrize("kind", KINDS)
def test_no_staleness_is_the_plain_objective(kind):
    """Behaviour == proximal: every weight is 1 and the loss is the on-policy one."""
    lp, prox, _, adv, mask = _batch(kind, 1e-2, 0.0)
    w = decoupled_is_weights(prox, prox, mask, kind, 2.0)
    assert torch.all(w == 1)
    a, b = lp.clone().requires_grad_(True), lp.clone().requires_grad_(True)
    out = policy_loss(a, prox, adv, mask, LossConfig(kind=kind), is_weights=w)
    plain = policy_loss(b, prox, adv, mask, LossConfig(kind=kind))
    out.loss.backward()
    plain.loss.backward()
    torch.testing.assert_close(out.loss, plain.loss, rtol=0, atol=0)
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def test_stale_data_is_clipped_around_behaviour_but_learned_from_around_proximal():
    """The point of the decoupled form: data 1.5 nats (per token) away from the sampler is all
    outside GSPO's band around the behaviour ratio, none of it around the proximal policy."""
    lp, prox, beh, adv, mask = _batch("gspo", 0.0, 1.5)
    adv = adv.abs()  # clipped only above the band: a positive advantage
    beh = torch.where(mask > 0, prox - 1.5, 0.0)  # the sampler was less likely: ratio e^1.5
    cfg = LossConfig(kind="gspo")
    old_way = policy_loss(lp, beh, adv, mask, cfg)
    new_way = policy_loss(lp, prox, adv, mask, cfg,
                          is_weights=decoupled_is_weights(prox, beh, mask, "gspo", 2.0))
    assert old_way.metrics["clip_fraction"] == 1.0 and new_way.metrics["clip_fraction"] == 0.0


def test_weights_are_truncated_in_log_space_and_ignore_untrained_positions():
    prox = torch.zeros(3, 4)
    beh = torch.tensor([[-0.1, -0.1, -0.1, -0.1], [0.2, -1e4, 0.0, 0.0], [7.0, 1e30, 0, 0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
    seq = decoupled_is_weights(prox, beh, mask, "gspo", 2.0)
    torch.testing.assert_close(seq, torch.tensor([math.exp(0.1), 2.0, 1.0]))
    tok = decoupled_is_weights(prox, beh, mask, "grpo", 2.0)
    assert torch.isfinite(tok).all()
    torch.testing.assert_close(tok[0], torch.full((4,), math.exp(0.1)))
    torch.testing.assert_close(tok[1], torch.tensor([math.exp(-0.2), 2.0, 1.0, 1.0]))
    torch.testing.assert_close(tok[2], torch.ones(4))
    with pytest.raises(ValueError, match="cap"):
        decoupled_is_weights(prox, beh, mask, "grpo", 0.0)


def test_gspo_takes_sequence_weights_only():
    lp, prox, beh, adv, mask = _batch("gspo", 1e-3, 0.1)
    with pytest.raises(ValueError, match="one importance weight per sequence"):
        policy_loss(lp, prox, adv, mask, LossConfig(kind="gspo"),
                    is_weights=torch.ones_like(lp))
    with pytest.raises(ValueError, match="is_weights must be"):
        policy_loss(lp, prox, adv, mask, LossConfig(kind="gspo"), is_weights=torch.ones(3))


@pytest.mark.parametrize("staleness, mode", [(0, "behavior"), (2, "recompute"),
                                             (8, "recompute"), (None, "recompute")])
def test_auto_picks_the_decoupled_objective_when_data_can_be_stale(staleness, mode):
    cfg = LearnerConfig(model="m", max_staleness=staleness)
    assert cfg.old_logprobs == "auto" and cfg.pi_old == mode
    explicit = LearnerConfig(model="m", max_staleness=staleness, old_logprobs="behavior")
    assert explicit.pi_old == "behavior"
