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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
