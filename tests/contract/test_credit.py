"""The credit rule for turn rewards (``gspo_rl.contract.credit.group_credit``) and the server's
zero-variance drop, which is the rule's own verdict: well defined, bounded, and the same
quantity on both sides."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import numpy as np
import pytest

from gspo_rl.contract.credit import AdvantageConfig, group_credit, group_turn_advantages
from gspo_rl.contract.schema import Keys, pack_ready_group, unpack_ready_group
from gspo_rl.learner.algorithm.advantages import TurnAdvantages
from gspo_rl.learner.algorithm.losses import group_advantages
from gspo_rl.redisq.client import make_redis
from gspo_rl.redisq.groups.store import QueueConfig, RewardItem, RolloutStore
from tests.helpers.queue import aready_records, open_group

KEYS = Keys()


def test_equal_episode_returns_with_different_turn_returns_stay_bounded() -> None:
    # The issue's case: episode returns [1, 1] are equal, the second turns' are not. The old
    # rule divided by eps here: [[0, 0], [0, -1e6]].
    adv = group_turn_advantages([1.0, 0.0], [[0.0, 0.0], [1.0, 0.0]], [2, 2])
    assert all(np.all(np.isfinite(a)) for a in adv)
    assert max(float(np.abs(a).max()) for a in adv) <= math.sqrt(2)
    np.testing.assert_allclose(adv[0], [0.0, 1.0], atol=1e-5)  # right answer in the end
    np.testing.assert_allclose(adv[1], [0.0, -1.0], atol=1e-5)  # wrong answer in the end


def test_turn_rewards_do_not_push_later_turns_down() -> None:
    # Every episode answered correctly; the first used the tool twice (bonus 0.1 a tool turn).
    # Its final turn earned what every other final turn earned: it must not be punished (the
    # old rule gave it, and every other correct answer, a negative advantage).
    adv = group_turn_advantages([1.0] * 4, [[0.1, 0.1, 0.0], None, None, None], [3, 1, 1, 1])
    assert adv[0][2] == 0.0 and adv[0][1] == 0.0  # turns only it reached: nothing to compare
    assert adv[0][0] > 0  # the tool use earned its bonus
    assert all(a[0] < 0 for a in adv[1:])  # no tool use: the bonus is missing
    # Two episodes that both used the tool twice: their correct final turns are equal.
    adv = group_turn_advantages([1.0, 1.0, 0.0], [[0.1, 0.1, 0.0], [0.1, 0.1, 0.0], None],
                                [3, 3, 1])
    assert adv[0][2] == adv[1][2] > 0  # right answers, compared with the wrong one


def test_advantages_are_bounded_by_the_group_size_and_zero_without_spread() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        g = int(rng.integers(1, 9))
        turns = rng.integers(0, 5, g).tolist()
        rewards = rng.choice([0.0, 1.0, 0.5], g).tolist()
        turn_rewards = [rng.choice([0.0, 0.1, -0.3], n).tolist() if rng.random() < 0.7 else None
                        for n in turns]
        credit = group_credit(rewards, turn_rewards, turns)
        biggest = max([float(np.abs(a).max()) for a in credit.turn_advantages if len(a)]
                      + [float(np.abs(credit.sequence_advantages).max())])
        assert biggest <= math.sqrt(g) + 1e-9
        if not credit.has_signal:
            assert biggest == 0.0
        else:
            assert biggest > 0
    # Equal values that float rounding would leave at 1e-17 after "x - mean(x)" are zeros.
    flat = group_credit([0.1] * 3, [[0.1, 0.2]] * 3, [2, 2, 2])
    assert not flat.has_signal
    assert all(np.all(a == 0) for a in flat.turn_advantages)


def test_without_turn_rewards_and_for_gspo_the_rule_is_group_advantages() -> None:
    rewards = [0.0, 1.0, 0.5, 1.0]
    credit = group_credit(rewards, [None] * 4, [3, 1, 2, 2])
    np.testing.assert_allclose(credit.sequence_advantages, group_advantages(rewards).numpy(),
                               rtol=1e-6)
    # The sequence advantage is the whole episode's return (turn rewards included), the first
    # turn's advantage: GSPO and GSPO-token train on the same returns.
    credit = group_credit([1.0, 1.0, 0.0], [[0.5], [0.0], [0.25]], [1, 1, 1])
    np.testing.assert_allclose(credit.sequence_advantages,
                               group_advantages([1.5, 1.0, 0.25]).numpy(), rtol=1e-6)
    assert [a[0] for a in credit.turn_advantages] == credit.sequence_advantages.tolist()
    with pytest.raises(ValueError, match="turn rewards"):
        group_credit([1.0, 0.0], [[1.0, 2.0], None], [1, 1])


def _publish(url: str, items: list[RewardItem], config: QueueConfig | None = None
             ) -> tuple[str | None, list[bytes]]:
    async def main() -> tuple[str | None, list[bytes]]:
        client = make_redis(url)
        try:
            store = RolloutStore(client, KEYS, config or QueueConfig())
            ids = await open_group(store, "g", len(items))
            await store.post_rewards([RewardItem(rid, it.reward, it.turn_rewards, it.n_turns)
                                      for rid, it in zip(ids, items, strict=True)])
            view = await store.get_group("g")
            assert view is not None
            out = [data for _, data in await aready_records(client, KEYS)]
            await client.flushdb()
            return view.drop_reason, out
        finally:
            await client.aclose()

    return asyncio.run(asyncio.wait_for(main(), 60))


def test_equal_final_rewards_with_different_turn_rewards_are_published(redis_url: str) -> None:
    # Sparse final rewards, the signal in the turn rewards (the calculator's tool bonus): the
    # old check looked at final rewards only and dropped this group.
    reason, out = _publish(redis_url, [RewardItem("", 1.0, [0.1]), RewardItem("", 1.0, [0.0])])
    assert reason is None and len(out) == 1
    group = unpack_ready_group(out[0])
    assert pack_ready_group(group) == out[0]
    assert group.advantages == pytest.approx([1.0, -1.0], abs=1e-4)
    assert group.turn_advantages == [[group.advantages[0]], [group.advantages[1]]]
    # The learner spreads the published per-turn advantages, whatever its own eps / scale.
    per_token = TurnAdvantages(scale=False)(group, 1)
    (a, b) = group.rollouts[1].turns[0]
    assert per_token[a:b].tolist() == [np.float32(group.turn_advantages[1][0])] * (b - a)
    # Only the turn counts tell: an episode without turn rewards reaches turn 2, where the
    # other's reward-to-go differs from its 0 (episode totals are equal).
    reason, out = _publish(redis_url, [RewardItem("", 0.0, None, n_turns=2),
                                       RewardItem("", 0.0, [0.5, -0.5], n_turns=2)])
    assert reason is None and len(out) == 1
    group = unpack_ready_group(out[0])
    assert group.advantages == [0.0, 0.0]  # whole episodes earned the same
    assert group.turn_advantages[0][1] > 0 > group.turn_advantages[1][1]
    # No spread anywhere: dropped, counted as zero variance.
    reason, out = _publish(redis_url, [RewardItem("", 1.0, [0.1]), RewardItem("", 1.0, [0.1])])
    assert reason == "zero_variance" and out == []


def test_each_group_records_its_advantage_config_and_the_learner_uses_it(redis_url: str) -> None:
    # A server set not to scale: the published group says so, and a learner recomputing its
    # per-turn advantages (a record without them) centres only, as the server did, instead of
    # scaling with the learner's own defaults (the old split between the two processes).
    rewards, turn_rewards = [1.0, 0.0, 0.0], [[0.5], [0.25], [0.0]]
    items = [RewardItem("", r, t) for r, t in zip(rewards, turn_rewards, strict=True)]
    reason, out = _publish(redis_url, items, QueueConfig(scale_advantages=False,
                                                         advantage_eps=1e-3))
    assert reason is None and len(out) == 1
    group = unpack_ready_group(out[0])
    assert group.advantage_config == AdvantageConfig(eps=1e-3, scale=False)
    assert pack_ready_group(group) == out[0]
    unscaled = group_turn_advantages(rewards, turn_rewards, [1, 1, 1], scale=False)
    stripped = dataclasses.replace(group, turn_advantages=[])
    per_token = TurnAdvantages().group_token_advantages(stripped)
    for rec, tokens, a in zip(group.rollouts, per_token, unscaled, strict=True):
        assert [float(tokens[start]) for start, _ in rec.turns] == pytest.approx(a.tolist())
    # A record written before the config was recorded falls back to the learner's defaults.
    old = dataclasses.replace(stripped, advantage_config=None)
    assert unpack_ready_group(pack_ready_group(old)).advantage_config is None
    scaled = group_turn_advantages(rewards, turn_rewards, [1, 1, 1])
    assert scaled[0][0] != pytest.approx(unscaled[0][0])
    per_token = TurnAdvantages().group_token_advantages(old)
    assert float(per_token[0][group.rollouts[0].turns[0][0]]) == pytest.approx(scaled[0][0])


def test_advantage_config_is_one_definition_on_both_sides() -> None:
    assert QueueConfig().advantage == AdvantageConfig()
    assert TurnAdvantages().eps == AdvantageConfig().eps
    assert TurnAdvantages().scale == AdvantageConfig().scale
    with pytest.raises(ValueError):
        AdvantageConfig(eps=0.0)
