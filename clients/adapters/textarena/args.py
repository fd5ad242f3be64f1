"""The ``--env-arg`` settings of a ``textarena:`` environment (``TextArenaArgs``).

``parse_args(args)`` validates the settings dict that ``load`` receives: unknown keys and bad
values are refused with one ``ValueError`` that names every problem (``textarena: bad
--env-arg (...)``), before any game is made. ``game`` is not checked here: it is passed to
``textarena.make`` as the game's own keyword arguments, and ``load`` refuses what the game does
not take when it makes the first one.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gspo_rl.client.adapters.chat import check_seed, validated

SYSTEM_PROMPT = ("You are playing a text game. Read the rules, then answer each turn with your "
                 "move in square brackets, exactly as the game asks (for example [5] or [A C]): "
                 "only the bracketed move counts, so put nothing else in brackets.")


class TextArenaArgs(BaseModel):
    """The ``--env-arg`` settings of a ``textarena:`` environment."""

    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(4, ge=1)
    """Episodes per group: games of one seed."""
    game: dict[str, Any] = Field(default_factory=dict)
    """The game's own keyword arguments (``textarena.make(env_id, **game)``), over the ones its
    id registers (``game.max_turns=5``, ``game.max_number=50``)."""
    max_turns: int = Field(32, ge=1)
    """Model turns (chat completions) per episode at most; a game not over by then ends there
    with ``unfinished_reward``."""
    unfinished_reward: float = 0.0
    """The reward of a game that ``max_turns`` cut short (textarena gave it none)."""
    invalid_penalty: float = Field(0.0, ge=0.0)
    """The turn reward of a move the game refused (it says why and waits for another move);
    other turns get 0.0."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Over ``SAMPLING``; keys the openai client lacks (top_k, min_p) go in ``extra_body``."""
    system_prompt: str = SYSTEM_PROMPT
    """The first message of every episode; "" for none."""
    seed: bool | int = True
    """true: each group's seed (drawn from the run's seed) resets every game of the group;
    false: each game is random (a group's games differ); an int: every group plays it."""
    eval_size: int = Field(0, ge=0)
    """Held-out seeds ``eval_seed .. eval_seed + eval_size - 1`` (never trained on), played as
    the eval set; 0: none."""
    eval_seed: int = Field(0, ge=0)
    """The first held-out seed."""
    eval_every: int | None = Field(None, ge=1)
    """Policy versions between evaluations (default: ``gspo up``'s, 10)."""
    eval_samples: int | None = Field(None, ge=1)
    """Games per held-out seed in an evaluation (default 4)."""
    timeout_s: float = Field(120.0, gt=0.0)
    """Time limit of one chat completion."""

    seed_rule = field_validator("seed")(check_seed)


def parse_args(args: dict[str, Any]) -> TextArenaArgs:
    """The validated settings; ValueError naming every bad key."""
    return validated(TextArenaArgs, args, "textarena")
