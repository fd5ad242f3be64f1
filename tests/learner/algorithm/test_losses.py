"""The mathematics of the four objectives, pinned on CPU."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from benchmarks.bench_losses import reference_loss
from gspo_rl.learner.algorithm.config import LossConfig
from gspo_rl.learner.algorithm.losses import group_advantages, policy_loss

KINDS = ["gspo", "gspo_token", "grpo", "sapo"]


def _batch(seed: int = 0, B: int = 4, T: int = 7, lengths: tuple[int, ...] = (7, 3, 5, 1)):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 1e-2
    mask = torch.zeros(B, T, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return lp, old, adv, mask


def _grad(kind: str, lp, old, adv, mask, **cfg_kw):
    lp = lp.clone().requires_grad_(True)
    out = policy_loss(lp, old, adv, mask, LossConfig(kind=kind, **cfg_kw))
    out.loss.backward()
    return out, lp.grad


# ---------------------------------------------------------------- config and API


def test_config_defaults_per_kind():
    assert (LossConfig(kind="gspo").clip_low, LossConfig(kind="gspo").clip_high) == (3e-4, 4e-4)
    assert LossConfig(kind="gspo_token").clip_high == 4e-4
    assert (LossConfig(kind="grpo").clip_low, LossConfig(kind="grpo").clip_high) == (0.2, 0.27)
    assert LossConfig(kind="sapo").tau_pos == 1.0 and LossConfig(kind="sapo").tau_neg == 1.05
    assert LossConfig(kind="grpo", clip_low=0.1).clip_low == 0.1


@pytest.mark.parametrize("bad", [
    {"kind": "ppo"}, {"clip_low": 0.0}, {"clip_low": 1.0}, {"clip_high": -1.0},
    {"tau_pos": 0.0}, {"tau_neg": -1.0}, {"max_log_ratio": 0.0}, {"max_log_ratio": 1000.0},
    {"unknown": 1},
])
def test_config_rejects_invalid(bad):
    with pytest.raises(ValidationError):
        LossConfig(**bad)


def test_gspo_rejects_token_advantages_with_clear_message():
    lp, old, _, mask = _batch()
    with pytest.raises(ValueError, match="gspo_token"):
        policy_loss(lp, old, torch.zeros_like(lp), mask, LossConfig(kind="gspo"))


@pytest.mark.parametrize("shapes", [((4, 7), (4, 6), (4,)), ((4, 7), (4, 7), (3,)),
                                    ((4, 7), (4, 7), (4, 6))])
def test_shape_mismatch_is_an_error(shapes):
    lp_s, old_s, adv_s = shapes
    with pytest.raises(ValueError, match="must"):
        policy_loss(torch.zeros(lp_s), torch.zeros(old_s), torch.zeros(adv_s),
                    torch.ones(lp_s), LossConfig(kind="grpo"))


# ---------------------------------------------------------------- on-policy


@pytest.mark.parametrize("kind", KINDS)
def test_on_policy_ratio_is_one_and_gradient_is_minus_a_over_b_len(kind):
    lp, _, adv, mask = _batch()
    out, grad = _grad(kind, lp, lp.clone(), adv, mask)
    assert out.metrics["ratio_mean"] == 1.0
    assert out.metrics["clip_fraction"] == 0.0
    B = lp.shape[0]
    lengths = mask.sum(-1)
    expected = -(adv / (B * lengths))[:, None] * mask
    torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-12)


# ---------------------------------------------------------------- agreement with the oracle


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("spread", [1e-4, 1e-2, 0.5])
def test_matches_autograd_transcription(kind, spread):
    lp, old, adv, mask = _batch(seed=3)
    lp = old + (lp - old) / 1e-2 * spread
    adv_in = adv if kind == "gspo" else adv[:, None] * (1 + torch.rand_like(lp))
    w = torch.tensor([0.5, 1.0, 2.0, 0.0], dtype=torch.float64)
    cfg = LossConfig(kind=kind)
    a = lp.clone().requires_grad_(True)
    b = lp.clone().requires_grad_(True)
    out = policy_loss(a, old, adv_in, mask, cfg, is_weights=w)
    ref = reference_loss(b, old, adv_in, mask, cfg, is_weights=w)
    out.loss.backward()
    ref.backward()
    torch.testing.assert_close(out.loss, ref, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------- gspo_token == gspo


@pytest.mark.parametrize("spread", [1e-5, 3e-4, 5e-2])
def test_gspo_token_with_constant_advantages_equals_gspo(spread):
    lp, old, adv, mask = _batch(seed=5)
    lp = old + (lp - old) / 1e-2 * spread
    out_s, g_s = _grad("gspo", lp, old, adv, mask)
    out_t, g_t = _grad("gspo_token", lp, old, adv[:, None].expand_as(lp).clone(), mask)
    assert out_s.metrics["loss"] == pytest.approx(out_t.metrics["loss"], rel=1e-9)
    for key in ("clip_fraction", "clip_low_fraction", "clip_high_fraction", "ratio_mean"):
        assert out_s.metrics[key] == pytest.approx(out_t.metrics[key], rel=1e-9, abs=1e-12)
    torch.testing.assert_close(g_s, g_t, rtol=1e-9, atol=1e-12)
    if spread > 1e-3:
        assert out_s.metrics["clip_fraction"] > 0  # the comparison covered clipped sequences


# ---------------------------------------------------------------- clipping


@pytest.mark.parametrize("kind", ["gspo", "gspo_token", "grpo"])
def test_clipping_is_one_sided_by_sign_of_advantage(kind):
    # One sequence, far above the band (ratio e^0.5) and far below it (ratio e^-0.5).
    mask = torch.ones(1, 4, dtype=torch.float64)
    old = torch.full((1, 4), -2.0, dtype=torch.float64)
    for delta, sign, clipped, side in [(0.5, 1.0, True, "high"), (0.5, -1.0, False, None),
                                       (-0.5, -1.0, True, "low"), (-0.5, 1.0, False, None)]:
        out, g = _grad(kind, old + delta, old, torch.tensor([sign], dtype=torch.float64), mask)
        if clipped:
            assert torch.all(g == 0), (delta, sign)
            assert out.metrics["clip_fraction"] == 1.0
            assert out.metrics[f"clip_{side}_fraction"] == 1.0
        else:
            assert torch.all(g != 0), (delta, sign)
            assert out.metrics["clip_fraction"] == 0.0


def test_gspo_clips_whole_sequences():
    # One token far off-policy pushes the sequence out of the band: no token gets gradient.
    mask = torch.ones(2, 5, dtype=torch.float64)
    old = torch.full((2, 5), -1.0, dtype=torch.float64)
    lp = old.clone()
    lp[0, 2] += 0.05
    out, g = _grad("gspo", lp, old, torch.tensor([1.0, 1.0], dtype=torch.float64), mask)
    assert torch.all(g[0] == 0) and torch.all(g[1] != 0)
    assert out.metrics["clip_fraction"] == 0.5
    out_grpo, g_grpo = _grad("grpo", lp, old, torch.tensor([1.0, 1.0], dtype=torch.float64),
                             mask)
    assert (g_grpo[0] != 0).sum() == 5  # 0.05 is inside GRPO's wide band
    assert out_grpo.metrics["clip_fraction"] == 0.0


# ---------------------------------------------------------------- padding and length


@pytest.mark.parametrize("kind", KINDS)
def test_padding_invariance(kind):
    lp, old, adv, mask = _batch(seed=7)
    adv_in = adv if kind == "gspo" else adv[:, None] * torch.linspace(0.5, 1.5, lp.shape[1])
    out_a, g_a = _grad(kind, lp, old, adv_in, mask)
    junk = torch.tensor([float("-inf"), float("inf"), float("nan"), 1e30], dtype=torch.float64)
    lp2, old2 = lp.clone(), old.clone()
    pad = mask == 0
    lp2[pad] = junk[torch.arange(int(pad.sum())) % 4]
    old2[pad] = junk[(torch.arange(int(pad.sum())) + 1) % 4]
    adv2 = adv_in.clone()
    if adv2.dim() == 2:
        adv2[pad] = float("nan")
    out_b, g_b = _grad(kind, lp2, old2, adv2, mask)
    assert out_a.metrics == out_b.metrics
    assert torch.equal(g_a[mask > 0], g_b[mask > 0])
    assert torch.all(g_b[pad] == 0)


@pytest.mark.parametrize("kind", KINDS)
def test_empty_sequences_contribute_nothing(kind):
    lp, old, adv, mask = _batch(seed=2)
    out_a, g_a = _grad(kind, lp, old, adv, mask)
    z = torch.zeros(1, lp.shape[1], dtype=lp.dtype)
    out_b, g_b = _grad(kind, torch.cat([lp, z - math.inf]), torch.cat([old, z]),
                       torch.cat([adv, torch.tensor([5.0], dtype=lp.dtype)]),
                       torch.cat([mask, z]))
    assert out_b.metrics["loss"] == pytest.approx(out_a.metrics["loss"], rel=1e-12)
    torch.testing.assert_close(g_b[:-1], g_a)
    assert torch.all(g_b[-1] == 0)
    all_empty, g = _grad(kind, lp, old, adv, torch.zeros_like(mask))
    assert all_empty.metrics["loss"] == 0.0 and torch.all(g == 0)


def test_duplicating_tokens_leaves_sequence_ratio_unchanged():
    lp, old, adv, mask = _batch(seed=11, B=3, T=5, lengths=(5, 5, 5))
    cfg = LossConfig(kind="gspo")
    once = policy_loss(lp, old, adv, mask, cfg)
    twice = policy_loss(lp.repeat_interleave(2, dim=1), old.repeat_interleave(2, dim=1), adv,
                        mask.repeat_interleave(2, dim=1), cfg)
    assert twice.metrics["ratio_mean"] == pytest.approx(once.metrics["ratio_mean"], rel=1e-12)
    assert twice.metrics["loss"] == pytest.approx(once.metrics["loss"], rel=1e-12)


def test_aggregation_is_seq_mean_token_mean():
    # Two sequences, lengths 1 and 9, same advantage: each weighs 1/2 whatever its length.
    mask = torch.zeros(2, 9, dtype=torch.float64)
    mask[0, 0] = 1
    mask[1, :] = 1
    lp = torch.zeros(2, 9, dtype=torch.float64)
    _, g = _grad("grpo", lp, lp.clone(), torch.tensor([1.0, 1.0], dtype=torch.float64), mask)
    assert g[0].sum().item() == pytest.approx(-0.5)
    assert g[1].sum().item() == pytest.approx(-0.5)


# ---------------------------------------------------------------- SAPO


def test_sapo_gate_has_slope_one_at_ratio_one():
    mask = torch.ones(1, 1, dtype=torch.float64)
    for a in (1.0, -1.0):
        adv = torch.tensor([a], dtype=torch.float64)
        h = 1e-6
        old = torch.zeros(1, 1, dtype=torch.float64)
        # objective J = -loss = f(r) A with r = exp(lp - old); d f / d r at r = 1:
        up = policy_loss(torch.log(torch.tensor([[1 + h]], dtype=torch.float64)), old, adv,
                         mask, LossConfig(kind="sapo")).metrics["loss"]
        dn = policy_loss(torch.log(torch.tensor([[1 - h]], dtype=torch.float64)), old, adv,
                         mask, LossConfig(kind="sapo")).metrics["loss"]
        assert -(up - dn) / (2 * h) / a == pytest.approx(1.0, rel=1e-6)
        out = policy_loss(old, old, adv, mask, LossConfig(kind="sapo"))
        assert out.metrics["gate_mean"] == pytest.approx(1.0)


def test_sapo_gate_fades_far_off_policy():
    mask = torch.ones(1, 1, dtype=torch.float64)
    adv = torch.tensor([1.0], dtype=torch.float64)
    _, g_near = _grad("sapo", torch.tensor([[0.01]], dtype=torch.float64),
                      torch.zeros(1, 1, dtype=torch.float64), adv, mask)
    _, g_far = _grad("sapo", torch.tensor([[3.0]], dtype=torch.float64),
                     torch.zeros(1, 1, dtype=torch.float64), adv, mask)
    assert abs(g_far.item()) < 0.1 * abs(g_near.item())


# ---------------------------------------------------------------- numerics


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(KINDS), seed=st.integers(0, 10_000),
       spread=st.sampled_from([1e-3, 0.05, 0.3]))
def test_gradient_agrees_with_finite_differences(kind, seed, spread):
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 4
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    lp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * spread
    mask = (torch.rand(B, T, generator=g) > 0.3).double()
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    if kind in ("grpo", "sapo"):
        adv = adv[:, None] + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    elif kind == "gspo_token":
        # Its gradient is defined through stop-gradients: it equals the derivative of the value
        # only when advantages are constant within a sequence (the oracle test covers the rest).
        adv = adv[:, None].expand(B, T).clone()
    cfg = LossConfig(kind=kind, clip_low=0.2, clip_high=0.25)
    lp = lp.requires_grad_(True)
    policy_loss(lp, old, adv, mask, cfg).loss.backward()
    h = 1e-7
    fd = torch.zeros_like(lp)
    for i in range(B):
        for t in range(T):
            e = torch.zeros_like(lp)
            e[i, t] = h
            up = policy_loss(lp.detach() + e, old, adv, mask, cfg).metrics["loss"]
            dn = policy_loss(lp.detach() - e, old, adv, mask, cfg).metrics["loss"]
            fd[i, t] = (up - dn) / (2 * h)
    torch.testing.assert_close(lp.grad, fd, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_huge_log_ratios_stay_finite(kind, dtype):
    lp = torch.tensor([[0.0, -500.0, -1e4], [-1e4, 0.0, -0.1]], dtype=dtype)
    old = torch.tensor([[-1e4, 0.0, -0.1], [0.0, -1e4, -1e4]], dtype=dtype)
    mask = torch.ones_like(lp)
    adv = torch.tensor([1.0, -1.0], dtype=dtype)
    out, g = _grad(kind, lp, old, adv, mask)
    assert math.isfinite(out.metrics["loss"]) and torch.isfinite(out.loss)
    assert torch.isfinite(g).all() and g.dtype == dtype
    assert all(math.isfinite(v) for v in out.metrics.values())


# ---------------------------------------------------------------- advantages


def test_group_advantages_population_std():
    adv = group_advantages([0.0, 1.0])
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0]), atol=1e-5, rtol=0)
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0], [5.0, 5.0, 5.0, 5.0]])
    adv = group_advantages(r)
    assert torch.allclose(adv[0].mean(), torch.tensor(0.0), atol=1e-6)
    assert torch.allclose(adv[0].pow(2).mean(), torch.tensor(1.0), atol=1e-4)
    assert torch.all(adv[1] == 0)
    torch.testing.assert_close(group_advantages(r, scale=False)[0],
                               torch.tensor([-2.0, -1.0, 0.0, 3.0]))


@pytest.mark.parametrize("bad", [[], [[1.0, float("nan")]], [[[1.0]]]])
def test_group_advantages_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        group_advantages(bad)
