"""gspo_rl.learner.data.batching: padding, sorting, minibatch/microbatch splits, alignment, bad
data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gspo_rl.contract.schema import ReadyGroup, RolloutRecord
from gspo_rl.learner.data.batching import (
    collate,
    deal_minibatches,
    plan_step,
    samples_from_groups,
    split_micro,
)


def _rollout(rid: str, prompt_len: int, n_new: int, seed: int, temp: float = 1.0):
    rng = np.random.default_rng(seed)
    n = prompt_len + n_new
    mask = np.zeros(n, dtype=np.uint8)
    mask[prompt_len:] = 1
    lps = np.where(mask > 0, -rng.random(n).astype(np.float32) * 3, 0.0).astype(np.float32)
    return RolloutRecord(rollout_id=rid, group_id=rid.split("/")[0],
                         token_ids=rng.integers(0, 100, n).astype(np.int32), loss_mask=mask,
                         logprobs=lps, versions=np.where(mask > 0, 0, -1).astype(np.int32),
                         prompt_len=prompt_len, temperature=temp)


def _group(gid: str, lengths: list[int], prompt_len: int = 3, seed: int = 0) -> ReadyGroup:
    rs = [_rollout(f"{gid}/{i}", prompt_len, n, seed + i, temp=0.5 + 0.1 * i)
          for i, n in enumerate(lengths)]
    adv = [float(i) - (len(lengths) - 1) / 2 for i in range(len(lengths))]
    return ReadyGroup(group_id=gid, rollouts=rs, rewards=adv, advantages=adv,
                      turn_rewards=[None] * len(rs))


def test_collate_pads_right_and_keeps_alignment():
    g = _group("a", [2, 7, 4])
    samples = samples_from_groups([g])
    mb = collate(samples)
    assert mb.tokens_BT.shape == (3, 10) and mb.tokens_BT.dtype == torch.int64
    for i, r in enumerate(g.rollouts):
        n = len(r.token_ids)
        assert mb.lengths_B[i] == n
        assert torch.equal(mb.tokens_BT[i, :n], torch.from_numpy(r.token_ids.astype(np.int64)))
        assert mb.attention_BT[i, :n].all() and not mb.attention_BT[i, n:].any()
        assert torch.equal(mb.mask_BT[i, :n], torch.from_numpy(r.loss_mask.astype(np.float32)))
        assert not mb.mask_BT[i, n:].any()
        # entry t of the behavior row is the logprob of token t: same index as the record
        assert torch.equal(mb.behavior_BT[i, :n], torch.from_numpy(r.logprobs))
        assert mb.temperature_B[i] == pytest.approx(r.temperature)
        assert mb.advantages[i] == pytest.approx(g.advantages[i])
    assert mb.n_valid == 3 and mb.n_trained_tokens == 2 + 7 + 4


def test_split_micro_sorts_and_respects_the_token_budget():
    g = _group("a", [1, 9, 3, 5, 2, 8])
    samples = samples_from_groups([g])
    parts = split_micro(samples, micro_batch_tokens=24)
    lengths = [[s.length for s in p] for p in parts]
    flat = [n for p in lengths for n in p]
    assert flat == sorted(flat, reverse=True)  # longest first
    for p in lengths:
        assert len(p) * p[0] <= 24 or len(p) == 1
    assert sorted(flat) == sorted(s.length for s in samples)
    # A single rollout over the budget still gets a microbatch of its own.
    assert [len(p) for p in split_micro(samples, micro_batch_tokens=1)] == [1] * 6


def test_deal_minibatches_balances_tokens_and_keeps_groups_whole():
    groups = [_group(f"g{k}", [k + 1, 2 * k + 3, 4], seed=10 * k) for k in range(6)]
    samples = samples_from_groups(groups)
    parts = deal_minibatches(samples, 3)
    assert len(parts) == 3
    for p in parts:  # whole groups: every group's rollouts land in one minibatch
        assert len({s.group_index for s in p}) * 3 == len(p)
    totals = [sum(s.length for s in p) for p in parts]
    assert max(totals) - min(totals) <= max(sum(s.length for s in p if s.group_index == k)
                                            for p in parts for k in range(6))
    assert sorted(s.rollout_id for p in parts for s in p) == sorted(s.rollout_id
                                                                     for s in samples)


def test_deal_minibatches_splits_rollouts_when_groups_are_fewer():
    samples = samples_from_groups([_group("g", [3, 4, 5, 6])])
    parts = deal_minibatches(samples, 3)
    assert len(parts) == 3 and sum(len(p) for p in parts) == 4
    assert len(deal_minibatches(samples, 10)) == 4  # never an empty minibatch


def test_plan_loss_scales_sum_to_one_per_minibatch():
    groups = [_group(f"g{k}", [2, 5, 9, 4], seed=k) for k in range(4)]
    plan = plan_step(groups, n_minibatches=2, micro_batch_tokens=20)
    assert len(plan.minibatches) == 2 and plan.n_rollouts == 16
    for mb in plan.minibatches:
        assert len(mb.micro) > 1
        assert sum(m.loss_scale for m in mb.micro) == pytest.approx(1.0)
    assert plan.n_tokens == sum(len(r.token_ids) for g in groups for r in g.rollouts)
    assert plan.n_padded_tokens >= plan.n_tokens
    assert 0.0 <= plan.padding_fraction < 1.0


def test_sorting_reduces_padding_against_arrival_order():
    groups = [_group(f"g{k}", [2, 40, 3, 35], seed=k) for k in range(4)]
    plan = plan_step(groups, n_minibatches=1, micro_batch_tokens=100)
    unsorted = samples_from_groups(groups)
    naive = sum(len(unsorted[i:i + 2]) * max(s.length for s in unsorted[i:i + 2])
                for i in range(0, len(unsorted), 2))
    assert plan.n_padded_tokens < naive


def test_per_token_advantage_hook():
    g = _group("a", [3, 5])

    def per_token(group: ReadyGroup, i: int):
        if i == 0:
            return np.arange(len(group.rollouts[0].token_ids), dtype=np.float32)
        return 2.0

    mb = collate(samples_from_groups([g], per_token))
    assert mb.advantages.shape == mb.mask_BT.shape
    n0 = len(g.rollouts[0].token_ids)
    expect0 = torch.arange(n0, dtype=torch.float32) * mb.mask_BT[0, :n0]
    assert torch.equal(mb.advantages[0, :n0], expect0)
    assert torch.equal(mb.advantages[1], 2.0 * mb.mask_BT[1])


@pytest.mark.parametrize("defect, match", [
    ("mask0", "loss_mask\\[0\\]"), ("length", "equal"), ("nan", "non-finite"),
    ("temp", "temperature"), ("adv", "advantages"),
])
def test_bad_rollouts_are_rejected_with_a_clear_message(defect, match):
    g = _group("a", [3, 4])
    r = g.rollouts[0]
    if defect == "mask0":
        r.loss_mask = r.loss_mask.copy()
        r.loss_mask[0] = 1
    elif defect == "length":
        r.logprobs = r.logprobs[:-1]
    elif defect == "nan":
        r.logprobs = r.logprobs.copy()
        r.logprobs[-1] = np.nan
    elif defect == "temp":
        r.temperature = 0.0
    else:
        g.advantages = g.advantages[:1]
    with pytest.raises(ValueError, match=match):
        samples_from_groups([g])


def test_empty_step_is_an_error():
    with pytest.raises(ValueError, match="no rollouts"):
        plan_step([], 1, 100)


def test_packed_split_budgets_real_tokens_not_rows_times_longest():
    g = _group("a", [1, 9, 3, 5, 2, 8])  # lengths 4..12 with the 3-token prompt
    samples = samples_from_groups([g])
    packed = split_micro(samples, micro_batch_tokens=24, packed=True)
    for p in packed:
        assert sum(s.length for s in p) <= 24 or len(p) == 1
    # Padded cutting wastes budget on padding: packing needs fewer microbatches.
    assert len(packed) < len(split_micro(samples, micro_batch_tokens=24))
    plan = plan_step([g], 1, 24, packed=True)
    assert plan.n_padded_tokens == plan.n_tokens and plan.padding_fraction == 0.0
