"""Per-token advantages for multi-turn episodes (GSPO-token), as pure functions.

The credit rule: group-normalised return-to-go per model turn.

For episode ``i`` of a group with final reward ``R_i`` and optional per-turn rewards
``r_{i,1..K_i}`` (one per model turn, in order), the return of turn ``k`` is

    G_{i,k} = R_i + sum_{j >= k} r_{i,j}

(a turn is credited with what it and every later turn earned, plus the final outcome). The
baseline and scale come from the episode returns ``G_{i,1}`` of the whole group, exactly as
``group_advantages`` does for single-turn rollouts:

    A_{i,k} = (G_{i,k} - mean_i G_{i,1}) / (std_i G_{i,1} + eps)

and every token of model turn ``k`` gets ``A_{i,k}``; tokens the model did not write (system,
user, tool results, template tokens) get 0 and are masked out of the loss anyway.

Consequences, each pinned by a test: without turn rewards every turn's return is ``R_i`` and
every token gets the plain sequence advantage, so GSPO-token reduces to GSPO and single-turn
rollouts train unchanged; a later turn never gets credit for an earlier turn's reward.

Wiring: ``TurnAdvantages`` applies the rule to a ready group (rewards, turn rewards, the
rollouts' turn spans) and is what ``advantage_fn_for`` gives the per-token loss kinds; the
trainer uses ``advantage_fn_for(config.loss.kind)`` unless it is handed another function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from server.redis_schema import ReadyGroup


def turn_returns(reward: float, turn_rewards: Sequence[float] | None, n_turns: int) -> np.ndarray:
    """``G_k = R + sum_{j >= k} r_j`` for each of ``n_turns`` model turns."""
    if turn_rewards is None or len(turn_rewards) == 0:
        return np.full(n_turns, float(reward))
    if len(turn_rewards) != n_turns:
        raise ValueError(f"{len(turn_rewards)} turn rewards for {n_turns} model turns")
    rtg = np.cumsum(np.asarray(turn_rewards, dtype=np.float64)[::-1])[::-1]
    return rtg + float(reward)


def group_turn_advantages(
    rewards: Sequence[float],
    turn_rewards: Sequence[Sequence[float] | None],
    n_turns: Sequence[int],
    eps: float = 1e-6,
    scale: bool = True,
) -> list[np.ndarray]:
    """``A_{i,k}`` for every episode ``i`` and model turn ``k`` of one group."""
    returns = [turn_returns(r, tr, n) for r, tr, n in zip(rewards, turn_rewards, n_turns,
                                                          strict=True)]
    first = np.asarray([g[0] if len(g) else float(r) for g, r in zip(returns, rewards,
                                                                      strict=True)])
    # The affine map of group_advantages (population std), fitted on the episode returns and
    # applied to every turn's return.
    mean = first.mean()
    denom = first.std() + eps if scale else 1.0
    return [(g - mean) / denom for g in returns]


def token_advantages(
    length: int, turns: Sequence[tuple[int, int]], turn_adv: np.ndarray
) -> np.ndarray:
    """Spread per-turn advantages over a trajectory of ``length`` tokens (0 outside turns)."""
    if len(turns) != len(turn_adv):
        raise ValueError(f"{len(turn_adv)} advantages for {len(turns)} turns")
    out = np.zeros(length, dtype=np.float32)
    for (start, end), a in zip(turns, turn_adv, strict=True):
        if not 0 <= start <= end <= length:
            raise ValueError(f"turn span [{start}, {end}) outside a trajectory of {length}")
        out[start:end] = a
    return out


class TurnAdvantages:
    """``learner.batching.AdvantageFn`` of the per-token kinds (gspo_token, grpo, sapo): the
    credit rule above, applied to a ready group's rewards, turn rewards and turn spans.

    A group without turn rewards gets its published sequence advantages spread over each
    rollout's model turns, so such groups train exactly as with sequence advantages whatever
    normalisation the server was configured with. With turn rewards the advantages follow
    ``group_turn_advantages`` with ``eps`` and ``scale`` (the queue's defaults). A turn-reward
    count that does not match a rollout's turns raises ``ValueError`` (the learner drops the
    group as invalid and counts it). The last group's result is cached: the batching calls
    this once per rollout, in order.
    """

    def __init__(self, eps: float = 1e-6, scale: bool = True) -> None:
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
        if all(not t for t in group.turn_rewards):
            per_turn = [np.full(len(r.turns), float(a)) for r, a in zip(rollouts,
                                                                      group.advantages,
                                                                      strict=True)]
        else:
            per_turn = group_turn_advantages(group.rewards, group.turn_rewards,
                                             [len(r.turns) for r in rollouts], self.eps,
                                             self.scale)
        return [token_advantages(len(r.token_ids), r.turns, a)
                for r, a in zip(rollouts, per_turn, strict=True)]


def advantage_fn_for(kind: str) -> Callable[[ReadyGroup, int], float | np.ndarray]:
    """The advantage function a loss kind trains with: "gspo" takes one advantage per
    sequence (per-token advantages are refused by design); the others take per-token ones."""
    if kind == "gspo":
        from learner.batching import sequence_advantage

        return sequence_advantage
    return TurnAdvantages()
