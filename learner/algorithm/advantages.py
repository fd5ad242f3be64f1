"""The learner's side of the credit rule (``gspo_rl.contract.credit``): per-token advantages of a
ready group for the per-token loss kinds, and the advantage function each loss kind uses."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gspo_rl.contract.credit import AdvantageConfig, group_turn_advantages, token_advantages
from gspo_rl.contract.queue.schema import ReadyGroup


class TurnAdvantages:
    """``gspo_rl.learner.data.batching.AdvantageFn`` of the per-token kinds (gspo_token, grpo,
    sapo): the credit rule (``gspo_rl.contract.credit``), spread over each rollout's model turns.

    A group published with per-turn advantages (``ReadyGroup.turn_advantages``, computed by
    the server with its ``AdvantageConfig``) uses them as they are. One without (records
    written by older servers, groups built in tests) spreads its sequence advantages when it
    has no turn rewards (what the rule gives), else gets ``group_credit`` with the group's
    own ``advantage_config``, or this object's ``eps`` and ``scale`` (the ``AdvantageConfig``
    defaults) for records that carry none. A count that does not match a rollout's
    turns raises ``ValueError`` (the learner drops the group as invalid and counts it). The
    last group's result is cached: the batching calls this once per rollout, in order.
    """

    def __init__(self, eps: float = AdvantageConfig.eps,
                 scale: bool = AdvantageConfig.scale) -> None:
        self.eps, self.scale = eps, scale
        self._group: object = None
        self._per_token: list[np.ndarray] = []

    def __call__(self, group: ReadyGroup, i: int) -> np.ndarray:
        if self._group is not group:
            self._per_token = self.group_token_advantages(group)
            self._group = group
        return self._per_token[i]

    def group_token_advantages(self, group: ReadyGroup) -> list[np.ndarray]:
        rollouts = group.rollouts
        if group.turn_advantages:
            per_turn = [np.asarray(a, dtype=np.float64) for a in group.turn_advantages]
            if len(per_turn) != len(rollouts):
                raise ValueError(f"group {group.group_id}: {len(per_turn)} per-turn advantage "
                                 f"lists for {len(rollouts)} rollouts")
        elif all(not t for t in group.turn_rewards):  # the rule gives A_i on every turn
            per_turn = [np.full(len(r.turns), float(a))
                        for r, a in zip(rollouts, group.advantages, strict=True)]
        else:
            config = group.advantage_config or AdvantageConfig(self.eps, self.scale)
            per_turn = group_turn_advantages(group.rewards, group.turn_rewards,
                                             [len(r.turns) for r in rollouts], config.eps,
                                             config.scale)
        return [token_advantages(len(r.token_ids), r.turns, a)
                for r, a in zip(rollouts, per_turn, strict=True)]


def advantage_fn_for(kind: str) -> Callable[[ReadyGroup, int], float | np.ndarray]:
    """The advantage function a loss kind trains with: "gspo" takes one advantage per
    sequence (per-token advantages are refused by design); the others take per-token ones."""
    if kind == "gspo":
        from gspo_rl.learner.data.batching import sequence_advantage

        return sequence_advantage
    return TurnAdvantages()
