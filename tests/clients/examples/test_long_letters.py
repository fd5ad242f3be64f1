"""The long-completion example (``long_letters``): its partial credit, its prompt and sampling,
and its name as a built-in ``--env`` spec."""

from __future__ import annotations

import random

import pytest

from gspo_rl.client.examples.alphabet import HALVES
from gspo_rl.client.examples.long_letters import LongLettersEnvironment, letters_in_half
from gspo_rl.client.loading import load_environment

LOW = HALVES["a to m"]


@pytest.mark.parametrize(("text", "credit"), [
    ("abcd", 1.0), ("ABCD", 1.0),  # case does not matter
    ("a b, c; d!", 1.0),  # other characters are skipped
    ("abzz", 0.5), ("zzzz", 0.0),
    ("ab", 0.5),  # too few letters: credit for those there are
    ("abcdzzzz", 1.0),  # letters past the length do not count
    ("", 0.0),
])
def test_partial_credit_is_the_share_of_positions_filled_from_the_half(
        text: str, credit: float) -> None:
    assert letters_in_half(text, LOW, 4) == credit


def test_the_environment_asks_for_its_length_and_samples_that_many_tokens() -> None:
    env = LongLettersEnvironment(group_size=4, length=300)
    task = env.sample_task(random.Random(0))
    assert env.prompt(task) == f"Write 300 letters from {task.half}:"
    assert env.sampling == {"max_tokens": 300, "temperature": 1.0}
    assert env.score(task, task.letters[0] * 300) == 1.0
    assert {env.sample_task(random.Random(s)).half for s in range(20)} == set(HALVES)
    with pytest.raises(ValueError, match="length"):
        LongLettersEnvironment(length=0)
    fixed = LongLettersEnvironment(half="n to z")
    assert {fixed.sample_task(random.Random(s)).half for s in range(20)} == {"n to z"}
    with pytest.raises(ValueError, match="half"):
        LongLettersEnvironment(half="a to z")


def test_it_is_a_builtin_spec_with_arguments() -> None:
    env = load_environment("long_letters", group_size=2, args={"length": 32})
    assert isinstance(env, LongLettersEnvironment) and env.length == 32 and env.group_size == 2
