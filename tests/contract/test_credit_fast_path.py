"""``group_credit``'s shortcut for groups without turn rewards gives the general rule's numbers
bit for bit (the general loop, forced with all-zero turn rewards, is the reference)."""

from __future__ import annotations

import numpy as np
import pytest

from gspo_rl.contract.credit import group_credit


def _cases() -> list[tuple[list[float], list[int]]]:
    rng = np.random.default_rng(0)
    out = []
    for size in (1, 2, 3, 8, 16, 64):
        out.append(([1.0] * size, [1] * size))  # no signal
        out.append(([float(x) for x in rng.integers(0, 3, size)], [1] * size))
        out.append(([float(x) for x in rng.normal(size=size) * 10.0 ** rng.integers(-6, 6)],
                    [int(n) for n in rng.integers(0, 4, size)]))  # some episodes turnless
    return out


@pytest.mark.parametrize("rewards,n_turns", _cases())
@pytest.mark.parametrize("eps,scale", [(1e-6, True), (1e-2, True), (1e-6, False)])
def test_outcome_only_matches_the_general_rule(rewards: list[float], n_turns: list[int],
                                               eps: float, scale: bool) -> None:
    fast = group_credit(rewards, [None] * len(rewards), n_turns, eps, scale)
    zeros = [[0.0] * n for n in n_turns]
    if not any(zeros):
        pytest.skip("no episode has a turn: nothing forces the general loop")
    general = group_credit(rewards, zeros, n_turns, eps, scale)
    assert fast.has_signal == general.has_signal
    assert fast.sequence_advantages.tobytes() == general.sequence_advantages.tobytes()
    assert [a.tobytes() for a in fast.turn_advantages] == [
        a.tobytes() for a in general.turn_advantages]
