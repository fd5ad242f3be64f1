"""A multi-turn task a tiny model learns: the alphabet demo as a conversation of ``turns`` asks.

    gspo up --env alphabet_dialogue
    gspo env alphabet_dialogue --env-arg turns=3 --env-arg turn_credit=true

Each episode is one conversation through the official ``openai.AsyncOpenAI`` client, every
chat completion carrying the episode's ``rollout_id``: the user asks for a word from one half
of the alphabet; after each reply the environment says whether its first letter was in the
asked half and asks again, until ``turns`` model turns are done. ``order="alternate"`` (the
default) asks "a to m", then "n to z", and so on: the right half depends on the turn, which a
tiny model learns from the conversation's shape (0.8 in 20-88 steps, BENCHMARKS.md);
``order="random"`` draws each ask anew, and the model must read the latest ask through the
chat template (the tiny model did not learn that in 150 steps). A reply is right when its
first letter lies in the half asked in that turn. The episode's reward is the share of its
turns answered right; with ``turn_credit`` it is the last turn's and each earlier turn earns
its own (``turn_rewards``: 1/turns when right), so the credit rule can tell the turns apart.
A random model scores about 0.5 per turn, so most groups carry a signal from the first step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from gspo_rl.client.environment import EpisodeResult, EpisodeSession, MultiTurnEnvironment
from gspo_rl.client.examples.alphabet import HALVES, first_letter

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

try:
    from openai import AsyncOpenAI
except ImportError as exc:  # the SDK itself is httpx-only; this example needs the client
    raise ImportError("the alphabet_dialogue example drives episodes with the official openai "
                      "client: pip install openai") from exc


ORDERS = ("alternate", "random")


@dataclass(frozen=True)
class DialogueTask:
    halves: tuple[str, ...]
    """The half asked in each turn, in order ("a to m" | "n to z")."""


def ask(half: str) -> str:
    return f"Say a word from {half}:"


def feedback(reply: str, half: str, right: bool) -> str:
    """The environment's answer to a reply: whether it was right, in a few words."""
    letter = first_letter(reply)
    said = f"'{letter}'" if letter else "no letter"
    return f"{'Right' if right else 'Wrong'}: {said}, asked {half}."


class AlphabetDialogueEnvironment(MultiTurnEnvironment):
    """``turns`` asks per episode; reward: the share answered right (module docstring)."""

    def __init__(self, group_size: int = 8, turns: int = 2, max_tokens: int = 8,
                 temperature: float = 1.0, turn_credit: bool = False,
                 order: str = "alternate", timeout_s: float = 120.0) -> None:
        if turns < 1:
            raise ValueError(f"turns must be >= 1, got {turns}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        self.group_size, self.turns, self.max_tokens = group_size, turns, max_tokens
        self.temperature, self.turn_credit, self.timeout_s = temperature, turn_credit, timeout_s
        self.order = order

    def sample_task(self, rng: random.Random) -> DialogueTask:
        halves = sorted(HALVES)
        if self.order == "alternate":
            return DialogueTask(tuple(halves[k % 2] for k in range(self.turns)))
        return DialogueTask(tuple(rng.choice(halves) for _ in range(self.turns)))

    def group_metadata(self, task: DialogueTask) -> dict[str, Any]:
        return {"task": "alphabet_dialogue", "halves": list(task.halves)}

    def result(self, right: list[bool]) -> EpisodeResult:
        """The episode's reward (and turn rewards with ``turn_credit``) from its turns."""
        if self.turn_credit:
            return EpisodeResult(reward=float(right[-1]),
                                 turn_rewards=[float(r) / self.turns for r in right[:-1]]
                                 + [0.0], correct=all(right))
        return EpisodeResult(reward=sum(right) / len(right), correct=all(right))

    async def episode(self, task: DialogueTask, session: EpisodeSession) -> EpisodeResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": ask(task.halves[0])}]
        right: list[bool] = []
        async with AsyncOpenAI(base_url=session.openai_base_url,
                               api_key=session.api_key or "unused", timeout=self.timeout_s,
                               max_retries=2) as client:
            for k, half in enumerate(task.halves):
                response = await client.chat.completions.create(
                    model=session.model,
                    messages=cast("list[ChatCompletionMessageParam]", messages),
                    max_tokens=self.max_tokens, temperature=self.temperature,
                    extra_body=session.extra_body)
                reply = response.choices[0].message.content or ""
                letter = first_letter(reply)
                right.append(letter is not None and letter in HALVES[half])
                messages.append({"role": "assistant", "content": reply})
                if k + 1 < len(task.halves):
                    messages.append({"role": "user", "content": feedback(
                        reply, half, right[-1]) + " " + ask(task.halves[k + 1])})
        return self.result(right)
