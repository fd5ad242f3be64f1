"""TextArena's single-player games as multi-turn environments: ``textarena:GAME_ID``.

``load(target, args)``: ``target`` is a game id of textarena's registry (``GuessTheNumber-v0``,
``TowerOfHanoi-v0``, ``Sudoku-v0-very-easy``...), ``args`` the settings (``args``); ``game``
holds the game's own keyword arguments for ``textarena.make``. ``load`` starts one game and
refuses with a ``ValueError`` what cannot be played here: an unknown id, a multi-player game, a
game that needs a download (NLTK data) or cannot be made (``game.check``); ``AdapterUnavailable``
without textarena (the ``textarena`` extra).

A task is a seed; the ``group_size`` games of a group are reset with it (``reset(num_players=1,
seed)``), each with its own random state, so they are the same game. An episode shows the
system prompt and the game's first observation as the user message, asks the rollout server for
the next assistant message (``session.extra_body`` on every call, the whole conversation each
time), plays the reply as the move (``step``) and shows what the game said since as the next
user message, until the game is over or ``max_turns``. The reward: the game's reward for player
0 (``state.rewards[0]``: 1 for a solved game, a fraction for partial progress, down to -1 for a
lost one, as each game defines it), or ``unfinished_reward`` for a game cut short;
``turn_rewards``: one per chat completion, ``-invalid_penalty`` for a move the game refused, else
0; ``correct``: a reward of 1. ``eval_tasks()``: the held-out seeds (``eval_size``). Guide:
docs/environments/textarena.md.

Modules: ``args`` (``TextArenaArgs``), ``game`` (one game: making, random state, observations,
the checks) and ``environment`` (``TextArenaEnvironment`` and ``load``).
"""

from __future__ import annotations

from gspo_rl.client.adapters.textarena.args import SYSTEM_PROMPT, TextArenaArgs, parse_args
from gspo_rl.client.adapters.textarena.environment import (
    SAMPLING,
    SEEDS,
    TextArenaEnvironment,
    load,
)
from gspo_rl.client.adapters.textarena.game import (
    NOTHING_NEW,
    Game,
    Step,
    check,
    library,
    make,
    render,
)

__all__ = ["NOTHING_NEW", "SAMPLING", "SEEDS", "SYSTEM_PROMPT", "Game", "Step",
           "TextArenaArgs", "TextArenaEnvironment", "check", "library", "load", "make",
           "parse_args", "render"]
