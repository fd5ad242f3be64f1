"""The per-turn advantages of a ready group: what the per-token losses (gspo_token, grpo,
sapo) train each model turn's tokens with. One function, used by the learner
(``gspo_rl.learner.algorithm.advantages.TurnAdvantages``) and by the server's trajectory view
(``GET /v1/groups/{id}?include=tokens``), so that the view shows exactly what is trained.

A group published with per-turn advantages (``ReadyGroup.turn_advantages``, computed by the
server when the group completed) uses them as they are. One without (records written by older
servers, groups built in tests) spreads its sequence advantages over every turn when it has
no turn rewards (what the credit rule gives), else gets ``group_credit`` with the group's own
``advantage_config``, or the given defaults for records that carry none. Raises
``ValueError`` on counts that do not match the rollouts.
"""

from __future__ import annotations

import numpy as np

from gspo_rl.contract.credit import AdvantageConfig, group_turn_advantages
from gspo_rl.contract.schema import ReadyGroup


def ready_turn_advantages(group: ReadyGroup,
                          default: AdvantageConfig | None = None) -> list[np.ndarray]:
    """``A_{i,k}`` (float64 ``[K_i]``) for every rollout ``i`` and model turn ``k``."""
    rollouts = group.rollouts
    if group.turn_advantages:
        per_turn = [np.asarray(a, dtype=np.float64) for a in group.turn_advantages]
        if len(per_turn) != len(rollouts):
            raise ValueError(f"group {group.group_id}: {len(per_turn)} per-turn advantage "
                             f"lists for {len(rollouts)} rollouts")
        return per_turn
    if all(not t for t in group.turn_rewards):  # the rule gives A_i on every turn
        return [np.full(len(r.turns), float(a))
                for r, a in zip(rollouts, group.advantages, strict=True)]
    config = group.advantage_config or default or AdvantageConfig()
    return group_turn_advantages(group.rewards, group.turn_rewards,
                                 [len(r.turns) for r in rollouts], config.eps, config.scale)
