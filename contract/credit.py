"""Per-token advantages for multi-turn episodes (GSPO-token), as pure functions.

The credit rule (``group_credit``), for a group of ``G`` episodes; episode ``i`` has a final
reward ``R_i``, ``K_i`` model turns and optional turn rewards ``r_{i,1..K_i}`` (none: all 0)::

    T_{i,k} = sum_{j >= k} r_{i,j}
    c_{i,k} = (R_i - mean_i R) + (T_{i,k} - mean_{j in S_k} T_{j,k})
    sigma^2 = mean_i max_k c_{i,k}^2        A_{i,k} = c_{i,k} / (sigma + eps)

``S_k``: the episodes that reach turn ``k`` (a turn only one reaches: that part is 0). With
``scale=False`` the advantages are only centred. The sequence advantage (``--loss gspo``) is
the first turn's. Every token of model turn ``k`` gets ``A_{i,k}``; tokens the model did not
write get 0. Zero spread is decided exactly, so ``GroupCredit.has_signal`` (the server's
zero-variance drop) is false exactly when every advantage is 0.

Arithmetic: doubles, every mean summed left to right (``_mean``), which the server's Lua copy
of the outcome-only rule (``gspo_rl.redisq.groups.credit``) reproduces bit for bit:
change the rule here and there together. Why this rule, and its wiring: docs/design/credit.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AdvantageConfig:
    """How the credit rule scales a group: ``A = c / (sigma + eps)``, or ``A = c`` when
    ``scale`` is False (only centred, Dr. GRPO style). Defined once: the server's
    ``QueueConfig`` sets it, each published group records it (``ReadyGroup.advantage_config``),
    and the learner recomputes a group's advantages with the group's own config, falling back
    to these defaults only for records written before it was recorded."""

    eps: float = 1e-6
    scale: bool = True

    def __post_init__(self) -> None:
        if not self.eps > 0:
            raise ValueError(f"advantage eps must be > 0, got {self.eps}")

    def to_dict(self) -> dict[str, float | bool]:
        return {"eps": self.eps, "scale": self.scale}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> AdvantageConfig:
        return cls(eps=float(d["eps"]), scale=bool(d["scale"]))  # type: ignore[arg-type]  # stored values: float() checks them


def turn_returns(reward: float, turn_rewards: Sequence[float] | None, n_turns: int) -> np.ndarray:
    """``G_k = R + sum_{j >= k} r_j`` for each of ``n_turns`` model turns."""
    return float(reward) + turn_rewards_to_go(turn_rewards, n_turns)


def turn_rewards_to_go(turn_rewards: Sequence[float] | None, n_turns: int) -> np.ndarray:
    """``T_k = sum_{j >= k} r_j`` for each of ``n_turns`` model turns (none given: zeros)."""
    if turn_rewards is None or len(turn_rewards) == 0:
        return np.zeros(n_turns)
    if len(turn_rewards) != n_turns:
        raise ValueError(f"{len(turn_rewards)} turn rewards for {n_turns} model turns")
    return np.cumsum(np.asarray(turn_rewards, dtype=np.float64)[::-1])[::-1].copy()


def _mean(x: np.ndarray) -> float:
    """The mean in a defined order: ``(((x_0 + x_1) + x_2) + ...) / n``, one rounding per
    addition (doubles), not numpy's pairwise/unrolled order, so that the Lua copy of the
    outcome-only rule (``gspo_rl.redisq.groups.credit``) gets the same bits; 0 for an empty
    array."""
    total = 0.0
    for v in x.tolist():
        total += v
    return total / x.size if x.size else 0.0


def _centred(x: np.ndarray) -> np.ndarray:
    """``x - mean(x)``, exactly 0 when all values are equal (no spread, no signal)."""
    if x.size == 0 or x.max() == x.min():
        return np.zeros_like(x)
    return x - _mean(x)


@dataclass(frozen=True)
class GroupCredit:
    """The credit rule's result for one group (see the module docstring)."""

    turn_advantages: list[np.ndarray]  # A_{i,k}: float64 [K_i] per episode
    sequence_advantages: np.ndarray  # A_i = A_{i,1} (an episode without turns: outcome only)
    has_signal: bool  # False: every advantage is exactly 0 (the server's zero-variance drop)


def group_credit(
    rewards_G: Sequence[float],
    turn_rewards_G: Sequence[Sequence[float] | None],
    n_turns_G: Sequence[int],
    eps: float = AdvantageConfig.eps,
    scale: bool = AdvantageConfig.scale,
) -> GroupCredit:
    """The credit rule (module docstring) for one group. Pure. Raises ``ValueError`` on a
    turn-reward count that does not match an episode's model turns, or non-finite rewards."""
    rewards = np.asarray(rewards_G, dtype=np.float64)
    if rewards.ndim != 1 or rewards.size == 0 or not np.isfinite(rewards).all():
        raise ValueError("rewards must be a non-empty list of finite numbers")
    if not len(rewards) == len(turn_rewards_G) == len(n_turns_G):
        raise ValueError(f"{len(rewards)} rewards, {len(turn_rewards_G)} turn-reward lists "
                         f"and {len(n_turns_G)} turn counts")
    if not any(turn_rewards_G) and all(int(n) >= 0 for n in n_turns_G):
        return _outcome_only(rewards, [int(n) for n in n_turns_G], eps, scale)
    to_go = [turn_rewards_to_go(tr, int(n)) for tr, n in zip(turn_rewards_G, n_turns_G,
                                                             strict=True)]
    if not all(np.isfinite(t).all() for t in to_go):
        raise ValueError("turn rewards must be finite")
    outcome = _centred(rewards)
    c = [np.full(len(t), o) for t, o in zip(to_go, outcome, strict=True)]
    for k in range(max((len(t) for t in to_go), default=0)):
        reach = [i for i, t in enumerate(to_go) if len(t) > k]
        centred_k = _centred(np.asarray([to_go[i][k] for i in reach]))
        for i, v in zip(reach, centred_k, strict=True):
            c[i][k] += v
    largest = np.asarray([np.abs(ci).max() if len(ci) else abs(o)
                          for ci, o in zip(c, outcome, strict=True)])
    sigma = math.sqrt(_mean(largest * largest))
    has_signal = sigma > 0
    denom = (sigma + eps) if scale and has_signal else 1.0
    turn_adv = [ci / denom for ci in c]
    seq = np.asarray([a[0] if len(a) else o / denom for a, o in zip(turn_adv, outcome,
                                                                     strict=True)])
    return GroupCredit(turn_adv, seq, has_signal)


def _outcome_only(rewards: np.ndarray, n_turns: list[int], eps: float,
                  scale: bool) -> GroupCredit:
    """``group_credit`` without turn rewards (every ``T`` is 0), in a few array operations:
    the same numbers as the general loop (``c_{i,k} = outcome_i``, ``sigma = std``), which
    costs ~10x more for the common single-turn group (the publish path runs it per group)."""
    outcome = _centred(rewards) + 0.0
    sigma = math.sqrt(_mean(outcome * outcome))
    has_signal = sigma > 0
    seq = outcome / ((sigma + eps) if scale and has_signal else 1.0)
    return GroupCredit([np.full(n, a) for n, a in zip(n_turns, seq, strict=True)], seq,
                       has_signal)


def group_turn_advantages(
    rewards: Sequence[float],
    turn_rewards: Sequence[Sequence[float] | None],
    n_turns: Sequence[int],
    eps: float = AdvantageConfig.eps,
    scale: bool = AdvantageConfig.scale,
) -> list[np.ndarray]:
    """``A_{i,k}`` for every episode ``i`` and model turn ``k`` of one group."""
    return group_credit(rewards, turn_rewards, n_turns, eps, scale).turn_advantages


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
