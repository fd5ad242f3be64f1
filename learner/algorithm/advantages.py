"""The learner's side of the credit rule (``gspo_rl.contract.credit``): per-token advantages of a
ready group for the per-token loss kinds, and the advantage function each loss kind uses."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gspo_rl.contract.credit import AdvantageConfig, token_advantages
from gspo_rl.contract.schema import ReadyGroup
from gspo_rl.contract.turn_advantages import ready_turn_advantages


class TurnAdvantages:
    """``gspo_rl.learner.data.batching.AdvantageFn`` of the per-token kinds (gspo_token, grpo,
    sapo): the credit rule (``gspo_rl.contract.credit``), spread over each rollout's model turns.

    The per-turn values are ``gspo_rl.contract.turn_advantages.ready_turn_advantages``
    (what the server's trajectory view shows), with this object's ``eps`` and ``scale`` for
    records that carry no ``advantage_config``. A count that does not match a rollout's
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
        per_turn = ready_turn_advantages(group, AdvantageConfig(self.eps, self.scale))
        return [token_advantages(len(r.token_ids), r.turns, a)
                for r, a in zip(group.rollouts, per_turn, strict=True)]


def advantage_fn_for(kind: str) -> Callable[[ReadyGroup, int], float | np.ndarray]:
    """The advantage function a loss kind trains with: "gspo" takes one advantage per
    sequence (per-token advantages are refused by design); the others take per-token ones."""
    if kind == "gspo":
        from gspo_rl.learner.data.batching import sequence_advantage

        return sequence_advantage
    return TurnAdvantages()
