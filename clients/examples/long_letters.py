"""A long-completion task: write ``length`` letters from the half of the alphabet the prompt names.

    gspo up --env long_letters --env-arg length=256

The alphabet demo (``alphabet``) stretched to completions of hundreds of tokens, where GSPO's
sequence-level ratio and GRPO's per-token ratios differ most (docs/reference/losses.md). The
prompt asks for ``length`` letters from "a to m" or from "n to z"; the reward is partial credit:
the share of the first ``length`` letters of the completion that lie in the asked half (other
characters are skipped; a completion with fewer letters earns only for those it has). A
randomly initialised model scores a fraction of 0.5 (about half its letters fall in the right
half, and not every token is a letter); 1.0 takes ``length`` letters, all from the right half.
Every sample earns a different reward, so every group carries a learning signal.
``half="a to m"`` (or "n to z") asks for the same half every time: the condition no longer
has to be carried across hundreds of tokens, only the letters' mix shifted.
"""

from __future__ import annotations

import random

from gspo_rl.client.environment import SingleTurnEnvironment
from gspo_rl.client.examples.alphabet import HALVES, AlphabetTask


def letters_in_half(text: str, half: str, length: int) -> float:
    """The share of ``length`` positions filled by letters of ``half`` (module docstring)."""
    letters = [ch for ch in text.lower() if "a" <= ch <= "z"][:length]
    return sum(ch in half for ch in letters) / length


class LongLettersEnvironment(SingleTurnEnvironment):
    """Single-turn, partial credit in [0, 1], completions of up to ``length`` tokens."""

    def __init__(self, group_size: int = 8, length: int = 256, temperature: float = 1.0,
                 half: str = "random"):
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        if half != "random" and half not in HALVES:
            raise ValueError(f"half must be 'random' or one of {sorted(HALVES)}, got {half!r}")
        self.group_size, self.length, self.half = group_size, length, half
        self.sampling = {"max_tokens": length, "temperature": temperature}

    def sample_task(self, rng: random.Random) -> AlphabetTask:
        return AlphabetTask(half=rng.choice(sorted(HALVES)) if self.half == "random"
                            else self.half)

    def prompt(self, task: AlphabetTask) -> str:
        return f"Write {self.length} letters from {task.half}:"

    def score(self, task: AlphabetTask, completion: str) -> float:
        return letters_in_half(completion, task.letters, self.length)
