"""gspo_rl.learner.trainer: gradients, direction of the update, recompute mode, metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.data.batching import collate, plan_step, samples_from_groups
from gspo_rl.learner.model.policy import Policy
from gspo_rl.learner.trainer import Trainer, truncated_is_weights
from tests.helpers.learner_data import sample_group


@pytest.fixture
def policy(tiny_model_dir) -> Policy:
    torch.manual_seed(0)
    return Policy.load(tiny_model_dir, device="cpu")


def _groups(policy: Policy, n: int = 4, seed: int = 0):
    return [sample_group(policy.model, group_size=4, prompt_len=3 + k % 3, new_tokens=(2, 9),
                         temperature=1.0, seed=seed + k) for k in range(n)]


def _cfg(tiny_model_dir, **kw) -> LearnerConfig:
    return LearnerConfig(model=str(tiny_model_dir), **kw)


def _seq_logprob_means(policy: Policy, groups) -> torch.Tensor:
    mb = collate(samples_from_groups(groups))
    with torch.no_grad():
        lp = policy.token_logprobs(mb.tokens_BT, mb.attention_BT, mb.temperature_B, mb.mask_BT)
    return (lp * mb.mask_BT).sum(-1) / mb.mask_BT.sum(-1)


def test_on_policy_gspo_gradient_is_the_policy_gradient(policy, tiny_model_dir):
    """On-policy (behavior logprobs from the same weights), s_i = 1 up to float noise: the
    accumulated GSPO gradient over several microbatches equals the plain policy gradient
    -(1/N) sum_i A_i mean_t grad log pi(y_it), computed by autograd in one batch."""
    groups = _groups(policy)
    trainer = Trainer(policy, _cfg(tiny_model_dir, micro_batch_tokens=40, grad_clip=None))
    plan = plan_step(groups, 1, 40, trainer.advantage_fn)
    assert len(plan.minibatches[0].micro) > 2
    # the trainer's accumulated gradient, without the optimiser step
    trainer.optimizer.zero_grad()
    for m in plan.minibatches[0].micro:
        d = trainer._device_batch(m)
        lp = policy.token_logprobs(d["tokens"], d["attention"], d["temperature"], d["mask"])
        from gspo_rl.learner.algorithm.losses import policy_loss

        out = policy_loss(lp, d["behavior"], d["advantages"], d["mask"], trainer.config.loss)
        assert out.metrics["clip_fraction"] == 0.0
        assert out.metrics["abs_log_ratio_mean"] < 1e-5
        (out.loss * m.loss_scale).backward()
    got = [p.grad.clone() for p in trainer.params]
    trainer.optimizer.zero_grad()
    mb = collate(samples_from_groups(groups))
    lp = policy.token_logprobs(mb.tokens_BT, mb.attention_BT, mb.temperature_B, mb.mask_BT)
    pg = -((lp * mb.mask_BT).sum(-1) / mb.mask_BT.sum(-1) * mb.advantages).mean()
    pg.backward()
    for g, p in zip(got, trainer.params, strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("kind", ["gspo", "gspo_token", "grpo", "sapo"])
def test_a_step_moves_the_policy_toward_the_advantage(policy, tiny_model_dir, kind):
    groups = _groups(policy, n=4)
    adv = torch.tensor([a for g in groups for a in g.advantages])
    before = _seq_logprob_means(policy, groups)
    cfg = _cfg(tiny_model_dir, lr=1e-3, loss={"kind": kind}, minibatches=2)
    metrics = Trainer(policy, cfg).step(groups)
    after = _seq_logprob_means(policy, groups)
    delta = after - before
    assert float((adv * delta).sum()) > 0
    assert float(delta[adv > 0].mean()) > float(delta[adv < 0].mean())
    assert metrics["optimizer_steps"] == 2
    for k in ("loss", "clip_fraction", "clip_low_fraction", "clip_high_fraction",
              "abs_log_ratio_mean", "grad_norm", "tokens_per_s", "compute_s"):
        assert math.isfinite(metrics[k]), k
    assert metrics["tokens"] == sum(len(r.token_ids) for g in groups for r in g.rollouts)
    assert metrics["trained_tokens"] == sum(int(r.loss_mask.sum()) for g in groups
                                            for r in g.rollouts)


def test_repeated_steps_raise_the_reward_likelihood(policy, tiny_model_dir):
    """Several updates on the same data: positive-advantage rollouts keep gaining."""
    groups = _groups(policy, n=3, seed=7)
    adv = torch.tensor([a for g in groups for a in g.advantages])
    before = _seq_logprob_means(policy, groups)
    trainer = Trainer(policy, _cfg(tiny_model_dir, lr=3e-4, loss={"kind": "grpo"}))
    for _ in range(3):
        trainer.step(groups)
    delta = _seq_logprob_means(policy, groups) - before
    assert float(delta[adv > 0].min()) > 0 > float(delta[adv < 0].max())


def test_truncated_is_weights():
    prox = torch.zeros(4, 5)
    beh = torch.zeros(4, 5)
    mask = torch.ones(4, 5)
    mask[3] = 0
    beh[0] -= 0.1  # prox/behavior = e^0.1
    beh[1] += 0.2  # e^-0.2
    beh[2] -= 5.0  # e^5 -> capped
    beh[2, 0] = 1e30  # masked-out garbage is ignored when the mask drops it
    mask[2, 0] = 0
    w = truncated_is_weights(prox, beh, mask, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([math.exp(0.1), math.exp(-0.2), 2.0, 1.0]))


@pytest.mark.parametrize("kind", ["gspo", "grpo"])
def test_recompute_mode_uses_pi_prox_and_is_weights(policy, tiny_model_dir, kind):
    """Behavior logprobs shifted by a per-sequence offset d_i (as if sampled by older weights):
    behavior mode clips every sequence; recompute mode (the default "auto" with a staleness
    bound) trains on-policy against pi_prox (ratio exactly 1) with weights min(e^{d_i}, C):
    one per sequence for gspo, one per trained token for grpo."""
    groups = _groups(policy, n=2)
    offsets = []
    for g in groups:
        for k, r in enumerate(g.rollouts):
            d = 0.3 * (k - 1.5)  # -0.45 .. 0.45
            r.logprobs = np.where(r.loss_mask > 0, r.logprobs - d, 0.0).astype(np.float32)
            offsets.append(d)
    cap = 1.3
    expected_w = np.minimum(np.exp(offsets), cap)
    # the weights' units: sequences for gspo, trained tokens (d_i on each) for grpo
    units = (np.ones(len(offsets)) if kind == "gspo" else
             np.array([float(r.loss_mask.sum()) for g in groups for r in g.rollouts]))
    state = {k: v.clone() for k, v in policy.model.state_dict().items()}

    loss = {"kind": kind}
    m_beh = Trainer(policy, _cfg(tiny_model_dir, lr=1e-4, loss=loss,
                                 old_logprobs="behavior")).step(groups)
    assert m_beh["clip_fraction"] > 0  # bands of 3e-4 / 0.2: |d| >= 0.15 is outside some

    policy.model.load_state_dict(state)
    cfg = _cfg(tiny_model_dir, lr=1e-4, loss=loss, is_weight_cap=cap)
    assert cfg.pi_old == "recompute"
    m_rec = Trainer(policy, cfg).step(groups)
    assert m_rec["clip_fraction"] == 0.0
    assert m_rec["abs_log_ratio_mean"] == 0.0  # pi_theta == pi_prox in the single update
    assert m_rec["is_weight_mean"] == pytest.approx(
        float((expected_w * units).sum() / units.sum()), abs=1e-4)
    assert m_rec["is_weight_capped_fraction"] == pytest.approx(
        float(((np.exp(offsets) >= cap) * units).sum() / units.sum()))
    assert m_rec["prox_behavior_abs_log_ratio"] == pytest.approx(
        float(np.abs(offsets).mean()), abs=1e-4)


@pytest.mark.parametrize("kind", ["gspo", "grpo"])
def test_one_minibatch_takes_pi_prox_from_its_own_forward(policy, tiny_model_dir, kind):
    """With one minibatch, pi_prox is the update's own forward, detached: one forward per
    microbatch instead of two, and the same update and IS figures as a separate pass."""
    groups = _groups(policy, n=2)
    for g in groups:  # stale behaviour log-probs: IS weights away from 1
        for k, r in enumerate(g.rollouts):
            r.logprobs = np.where(r.loss_mask > 0, r.logprobs - 0.2 * (k - 1.5),
                                  0.0).astype(np.float32)
    state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    cfg = _cfg(tiny_model_dir, lr=1e-3, loss={"kind": kind}, is_weight_cap=1.3)
    calls = []
    forward = policy.token_logprobs

    def counted(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return forward(*args, **kwargs)

    policy.token_logprobs = counted
    results = []
    for separate in (False, True):
        policy.model.load_state_dict(state)
        calls.clear()
        trainer = Trainer(policy, cfg)
        if separate:  # as with active dropout: pi_prox from its own pass without grad
            trainer._dropout = lambda: True  # type: ignore[method-assign]
        metrics = trainer.step(groups)
        results.append((metrics, {k: v.clone() for k, v in policy.model.state_dict().items()},
                        list(calls)))
    del policy.token_logprobs
    (fused, w_fused, c_fused), (sep, w_sep, c_sep) = results
    assert all(c_fused) and len(c_sep) == 2 * len(c_fused) and c_sep.count(False) == len(c_fused)
    for key in ("loss", "is_weight_mean", "is_weight_capped_fraction",
                "prox_behavior_abs_log_ratio", "grad_norm"):
        assert fused[key] == pytest.approx(sep[key], rel=1e-5, abs=1e-7), key
    assert 0 < fused["is_weight_capped_fraction"] < 1
    for name, w in w_fused.items():
        torch.testing.assert_close(w, w_sep[name], rtol=1e-5, atol=1e-7)
    assert any(not torch.equal(w, state[n]) for n, w in w_fused.items())


def test_nonfinite_gradient_skips_the_update(policy, tiny_model_dir):
    groups = _groups(policy, n=1)
    groups[0].advantages = [1e38, -1e38, 1e38, -1e38]  # overflows the float32 gradient
    before = [p.detach().clone() for p in policy.model.parameters()]
    metrics = Trainer(policy, _cfg(tiny_model_dir, lr=1e-3, loss={"kind": "grpo"})).step(groups)
    assert metrics["skipped_updates"] == 1 and metrics["optimizer_steps"] == 0
    for b, p in zip(before, policy.model.parameters(), strict=True):
        assert torch.equal(b, p)


@pytest.mark.parametrize("minibatches,epochs", [(1, 1), (1, 2), (2, 2)])
def test_epochs_pass_over_the_minibatches_and_let_the_clip_act(policy, tiny_model_dir,
                                                               minibatches, epochs):
    """``minibatches x epochs`` optimizer steps per step. One minibatch and one epoch in
    recompute mode: the ratio is exactly 1 and nothing is clipped (``clip_inactive`` says
    why); a second epoch starts from moved weights, so its ratios leave 1 and GSPO's narrow
    band clips."""
    groups = _groups(policy, n=4)
    cfg = _cfg(tiny_model_dir, lr=1e-2, loss={"kind": "gspo"}, minibatches=minibatches,
               epochs=epochs)
    metrics = Trainer(policy, cfg).step(groups)
    assert metrics["optimizer_steps"] == minibatches * epochs
    if minibatches == epochs == 1:
        assert cfg.clip_inactive is not None and "every ratio is 1" in cfg.clip_inactive
        assert metrics["clip_fraction"] == 0.0
        assert metrics["abs_log_ratio_mean"] < 1e-6
    else:
        assert cfg.clip_inactive is None
        assert metrics["clip_fraction"] > 0.0
