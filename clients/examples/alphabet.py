"""The demo task: say a word from the half of the alphabet the prompt names.

    python -m gspo_rl.client.examples.alphabet --url http://127.0.0.1:8000 --groups 100

The right answer depends on the prompt (a conditional task): the prompt asks for a word from
"a to m" or from "n to z", and a completion earns 1.0 when its first letter lies in the asked
half, else 0.0. A randomly initialised model scores about 0.5 (chance: its first letter falls
in either half about equally often, whatever the prompt); to pass 0.8 it has to read the prompt.
Why this task: with a byte-level vocabulary of ~1k tokens, a task with one right token would sit
at a chance of ~1/1000, and groups whose rewards are all equal carry no signal, so a tiny random
model would never start learning. Here every group has signal from the first step.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from gspo_rl.client.environment import SingleTurnEnvironment
from gspo_rl.client.runlog import run_and_print

HALVES = {"a to m": "abcdefghijklm", "n to z": "nopqrstuvwxyz"}


@dataclass(frozen=True)
class AlphabetTask:
    half: str  # "a to m" | "n to z"

    @property
    def letters(self) -> str:
        return HALVES[self.half]


def first_letter(text: str) -> str | None:
    for ch in text.lower():
        if "a" <= ch <= "z":
            return ch
    return None


class AlphabetEnvironment(SingleTurnEnvironment):
    """Single-turn, reward in {0, 1}, chance ~0.5."""

    def __init__(self, group_size: int = 8, max_tokens: int = 4, temperature: float = 1.0):
        self.group_size = group_size
        self.sampling = {"max_tokens": max_tokens, "temperature": temperature}

    def sample_task(self, rng: random.Random) -> AlphabetTask:
        return AlphabetTask(half=rng.choice(sorted(HALVES)))

    def prompt(self, task: AlphabetTask) -> str:
        return f"Say a word from {task.half}:"

    def score(self, task: AlphabetTask, completion: str) -> float:
        letter = first_letter(completion)
        return 1.0 if letter is not None and letter in task.letters else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    env = AlphabetEnvironment(group_size=args.group_size)
    run_and_print(env, args.url, args.groups, api_key=args.api_key,
                  concurrency=args.concurrency)


if __name__ == "__main__":
    main()
