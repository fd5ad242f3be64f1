"""``TextArenaEnvironment``: single-player TextArena games as a gspo multi-turn environment,
and ``load``, which builds one (the package docstring describes the episode).

``load(target, args)`` validates the settings (``args``) and starts one game of ``target`` as
an episode would (``game.check``), refusing with a ``ValueError`` what cannot be played; it
warns when two games of one seed begin differently (a game with randomness of its own).
"""

from __future__ import annotations

import logging
import random
from typing import Any

from openai import AsyncOpenAI

from gspo_rl.client.adapters.chat import chat_reply
from gspo_rl.client.adapters.textarena.args import TextArenaArgs, parse_args
from gspo_rl.client.adapters.textarena.game import Game, check, library
from gspo_rl.client.environment import EpisodeResult, EpisodeSession, MultiTurnEnvironment

log = logging.getLogger(__name__)

SAMPLING = {"temperature": 1.0, "max_tokens": 256}
SEEDS = 2**31
PROBE_SEED = 0
"""The seed of the games ``load`` starts."""


class TextArenaEnvironment(MultiTurnEnvironment):
    """A textarena game's episodes, played by the policy (package docstring). A task is the
    seed of a group's games."""

    def __init__(self, game_id: str, args: TextArenaArgs) -> None:
        self.game_id, self.args = game_id, args
        self.name = game_id
        self.group_size = args.group_size
        self.sampling = {**SAMPLING, **args.sampling}
        self.held_out = range(args.eval_seed, args.eval_seed + args.eval_size)
        self.eval_every, self.eval_samples = args.eval_every, args.eval_samples

    def sample_task(self, rng: random.Random) -> int:
        """A seed: ``seed`` when it is an int, else a draw that is not a held-out seed."""
        if type(self.args.seed) is int:
            return self.args.seed
        while True:
            seed = rng.randrange(SEEDS)
            if seed not in self.held_out:
                return seed

    def eval_tasks(self) -> list[int]:
        """The held-out seeds (``eval_size`` of them from ``eval_seed``)."""
        return list(self.held_out)

    def group_metadata(self, task: int) -> dict[str, Any]:
        return {"source": "textarena", "task_id": f"{self.game_id}/{task}"}

    def start(self, task: int) -> Game:
        """A new game of the task's seed (none with ``seed=false``)."""
        seed = None if self.args.seed is False else task
        return Game.start(self.game_id, self.args.game, seed)

    async def episode(self, task: int, session: EpisodeSession) -> EpisodeResult:
        return await self.play(task, session)

    async def play(self, task: int, session: EpisodeSession) -> EpisodeResult:
        """One episode, counted nowhere (an evaluation plays it with an unrecorded session)."""
        return await self.play_game(self.start(task), session)

    async def play_game(self, game: Game, session: EpisodeSession) -> EpisodeResult:
        """``game`` played to its end or ``max_turns``: the game's reward for player 0 (or
        ``unfinished_reward``), a turn reward per chat completion; correct: a reward of 1."""
        async with AsyncOpenAI(base_url=session.openai_base_url,
                               api_key=session.api_key or "unused",
                               timeout=self.args.timeout_s, max_retries=2) as llm:
            done, turns = await self._turns(game, llm, session)
        reward = game.reward() if done else self.args.unfinished_reward
        game.close()
        return EpisodeResult(reward=reward, turn_rewards=turns, correct=done and reward >= 1.0)

    async def _turns(self, game: Game, llm: AsyncOpenAI,
                     session: EpisodeSession) -> tuple[bool, list[float]]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": game.first}]
        if self.args.system_prompt:
            messages.insert(0, {"role": "system", "content": self.args.system_prompt})
        rewards: list[float] = []
        for _ in range(self.args.max_turns):
            text, assistant = await chat_reply(llm, messages, session, self.sampling)
            messages.append(assistant)
            step = game.step(text)
            rewards.append(-self.args.invalid_penalty if step.refused else 0.0)
            if step.done:
                return True, rewards
            messages.append({"role": "user", "content": step.text})
        return False, rewards


def load(target: str, args: dict[str, Any]) -> TextArenaEnvironment:
    """The textarena game ``target`` (a registered id) as a multi-turn environment; refused
    with a ValueError when it cannot be played here (``game.check``)."""
    settings = parse_args(args)
    library()  # AdapterUnavailable without textarena
    first = check(target, settings.game, PROBE_SEED)
    again = Game.start(target, settings.game, PROBE_SEED)
    if again.first != first.first and settings.seed is not False:
        log.warning("textarena: two games of %s with one seed began differently: the game has "
                    "randomness of its own, so a group's games may differ", target)
    return TextArenaEnvironment(target, settings)
