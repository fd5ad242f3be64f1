"""Several environments side by side (``gspo_rl.client.mixture.Mix``): groups drawn by weight,
the seed fixing the draws, a member that runs out leaving the mix, and the weights and names a
mix refuses. Pure: the members are plain objects, no environment runs."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gspo_rl.client.mixture import Member, Mix, members_of

DRAWS = 20_000


def shares(mix: Mix, seed: int, n: int = DRAWS) -> dict[str, float]:
    rng = random.Random(seed)
    counts = Counter(mix.pick(rng).name for _ in range(n))
    return {name: c / n for name, c in counts.items()}


def test_draws_land_near_the_weights() -> None:
    mix = Mix([Member("a", object(), 1.0), Member("b", object(), 3.0), Member("c", object(), 6)])
    got = shares(mix, seed=0)
    # 20 000 draws: a share's standard deviation is under 0.004; 0.02 is five of them
    assert got == pytest.approx({"a": 0.1, "b": 0.3, "c": 0.6}, abs=0.02)


def test_the_seed_fixes_the_draws_and_another_seed_changes_them() -> None:
    mix = Mix([Member("a", object(), 2.0), Member("b", object())])

    def names(seed: int) -> list[str]:
        rng = random.Random(seed)
        return [mix.pick(rng).name for _ in range(200)]

    assert names(7) == names(7)
    assert names(7) != names(8)


def test_a_tiny_weight_is_drawn_rarely_but_drawn() -> None:
    mix = Mix([Member("common", object(), 99.0), Member("rare", object(), 1.0)])
    got = shares(mix, seed=1)
    assert 0.003 < got["rare"] < 0.02


def test_a_retired_member_is_never_drawn_and_the_last_one_needs_no_draw() -> None:
    a, b = Member("a", object(), 5.0), Member("b", object(), 1.0)
    mix = Mix([a, b])
    mix.retire(a)
    rng = random.Random(0)
    state = rng.getstate()
    assert {mix.pick(rng).name for _ in range(50)} == {"b"}
    assert rng.getstate() == state, "one member left: its task order is the seed's alone"
    mix.retire(a)  # twice: no error
    mix.retire(b)
    with pytest.raises(IndexError, match="ran out of tasks"):
        mix.pick(rng)
    assert mix.get("a") is a and [m.name for m in mix.members] == ["a", "b"]
    with pytest.raises(KeyError):
        mix.get("c")


@pytest.mark.parametrize("weight", [0.0, -1.0, float("nan"), float("inf")])
def test_a_weight_that_is_not_a_finite_positive_number_is_refused(weight: float) -> None:
    with pytest.raises(ValueError, match=r"weight must be a finite number > 0, got b@"):
        Mix([Member("a", object()), Member("b", object(), weight)])


def test_a_mix_needs_members_with_names_apart() -> None:
    with pytest.raises(ValueError, match="at least one environment"):
        Mix([])
    with pytest.raises(ValueError, match="names must differ"):
        Mix([Member("a", object()), Member("a", object(), 2.0)])


def test_a_single_environment_is_one_nameless_member() -> None:
    env = object()
    [member] = members_of(env)
    assert (member.name, member.env, member.weight) == ("", env, 1.0)
    mix = Mix([Member("x", env)])
    assert members_of(mix) == mix.members
