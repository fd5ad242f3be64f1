"""The multi-turn credit rule: group-normalised return-to-go per model turn."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gspo_rl.contract.credit import group_turn_advantages, token_advantages, turn_returns
from gspo_rl.learner.algorithm.config import LossConfig
from gspo_rl.learner.algorithm.losses import group_advantages, policy_loss


def test_turn_returns_are_reward_to_go_plus_final():
    np.testing.assert_allclose(turn_returns(1.0, [0.5, 0.0, 0.25], 3), [1.75, 1.25, 1.25])
    np.testing.assert_allclose(turn_returns(2.0, None, 3), [2.0, 2.0, 2.0])
    with pytest.raises(ValueError, match="turn rewards"):
        turn_returns(1.0, [1.0], 2)


def test_without_turn_rewards_equals_sequence_advantages():
    rewards = [0.0, 1.0, 0.5, 1.0]
    adv = group_turn_advantages(rewards, [None] * 4, [3, 1, 2, 2])
    expected = group_advantages(rewards).numpy()
    for a, e in zip(adv, expected, strict=True):
        np.testing.assert_allclose(a, np.full(len(a), e), rtol=1e-6)


def test_later_turns_get_no_credit_for_earlier_rewards():
    adv = group_turn_advantages([0.0, 0.0], [[1.0, 0.0], [0.0, 0.0]], [2, 2])
    assert adv[0][0] > adv[0][1]  # the rewarded first turn earns more than the second
    assert adv[0][1] == pytest.approx(adv[1][1])  # second turns earned the same (nothing)


def test_token_advantages_fill_turns_and_zero_elsewhere():
    out = token_advantages(10, [(2, 4), (6, 9)], np.array([0.5, -1.0]))
    assert out.tolist() == [0, 0, 0.5, 0.5, 0, 0, -1, -1, -1, 0]
    with pytest.raises(ValueError):
        token_advantages(5, [(2, 7)], np.array([1.0]))


def test_gspo_token_gradients_zero_on_masked_tokens_and_equal_gspo_for_constant_turns():
    # Two episodes, 10 tokens each: model turns at [2,4) and [6,9); everything else is masked.
    turns = [(2, 4), (6, 9)]
    mask = torch.zeros(2, 10, dtype=torch.float64)
    for s, e in turns:
        mask[:, s:e] = 1
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(2, 10, generator=g, dtype=torch.float64)
    lp = (old + 1e-4 * torch.randn(2, 10, generator=g, dtype=torch.float64)).requires_grad_(True)
    rewards = [1.0, 0.0]
    per_turn = group_turn_advantages(rewards, [None, None], [2, 2])  # same advantage per turn
    adv_BT = torch.tensor(np.stack([token_advantages(10, turns, a) for a in per_turn]))
    out = policy_loss(lp, old, adv_BT, mask, LossConfig(kind="gspo_token"))
    out.loss.backward()
    assert torch.all(lp.grad[mask == 0] == 0)
    lp2 = lp.detach().clone().requires_grad_(True)
    seq = policy_loss(lp2, old, group_advantages(rewards).double(), mask, LossConfig(kind="gspo"))
    seq.loss.backward()
    torch.testing.assert_close(lp.grad, lp2.grad)
    # With turn rewards the turns get different advantages, and different gradients.
    per_turn = group_turn_advantages(rewards, [[1.0, 0.0], [0.0, 0.0]], [2, 2])
    adv_BT = torch.tensor(np.stack([token_advantages(10, turns, a) for a in per_turn]))
    lp3 = lp.detach().clone().requires_grad_(True)
    policy_loss(lp3, old, adv_BT, mask, LossConfig(kind="gspo_token")).loss.backward()
    assert not torch.allclose(lp3.grad[0, 2:4].mean(), lp3.grad[0, 6:9].mean())
    assert torch.all(lp3.grad[mask == 0] == 0)
