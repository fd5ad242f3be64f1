"""One TextArena game as the adapter plays it (``Game``), and the checks ``load`` makes.

``Game.start(game_id, kwargs, seed)`` makes the game with ``textarena.make`` and resets it for
one player. The game's observation wrappers are taken off (its action wrappers stay): they
fold the whole history into every observation, and a chat holds the history already, so a user
turn is what the game said since the model's last move (``render``). Every call into the game
runs with the game's own random state: textarena seeds and draws from Python's process-wide
``random`` (a few games numpy's), so games played at once would draw from each other's
sequence; with its own state, a seed fixes a game whatever else runs.

``check(game_id, kwargs, seed)`` starts one game as an episode does and refuses, with a
``ValueError`` that says why: an id textarena does not register, a game that needs NLTK data
that is not installed (textarena downloads it when the game is made), a multi-player game, a
game that cannot be made here (an import error, an API key it needs), settings the game does
not take, a game over at reset. ``library()`` raises ``AdapterUnavailable`` (the ``textarena``
extra) without textarena.
"""

from __future__ import annotations

import contextlib
import difflib
import random
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gspo_rl.client.adapters import missing

NOTHING_NEW = "Your move."
"""The user turn when the game said nothing after a move and goes on."""
MOST_PLAYERS = 6
"""A game that fails for one player but starts with 2 to 6 is refused as multi-player."""
_RNG_LOCK = threading.Lock()


def library() -> Any:
    """The ``textarena`` module; ``AdapterUnavailable`` naming the extra without it."""
    try:
        import textarena
        import textarena.envs.registration  # noqa: F401 - the registry, for check()
    except ImportError as exc:
        raise missing("textarena", exc) from None
    return textarena


def make(game_id: str, kwargs: dict[str, Any]) -> Any:
    """``textarena.make(game_id, **kwargs)`` without its observation wrappers."""
    ta = library()
    env = ta.make(env_id=game_id, **kwargs)
    kept: list[type] = []
    while isinstance(env, ta.Wrapper):
        if not isinstance(env, ta.ObservationWrapper):
            kept.append(type(env))
        env = env.env
    for wrapper in reversed(kept):
        env = wrapper(env)
    return env


def render(observation: Any) -> str:
    """The game's messages to the player as one user turn (the player's own move left out)."""
    if isinstance(observation, str):
        return observation.strip() or NOTHING_NEW
    action = library().ObservationType.PLAYER_ACTION
    parts = [str(text).strip() for _, text, kind in observation if kind != action]
    return "\n\n".join(p for p in parts if p) or NOTHING_NEW


@dataclass
class Step:
    """What a move did: whether the game is over, whether it refused the move, what it says."""

    done: bool
    refused: bool
    text: str


class Game:
    """A single-player textarena game with its own random state (module docstring)."""

    def __init__(self, game_id: str, seed: int | None) -> None:
        self.env: Any = None
        self.game_id, self.seed = game_id, seed
        self._random = random.Random(seed).getstate()
        numpy = sys.modules.get("numpy")
        self._numpy = None if numpy is None else numpy.random.RandomState(
            None if seed is None else seed % 2**32).get_state()
        self.first = ""
        """The reset's observation: the first user turn."""

    @classmethod
    def start(cls, game_id: str, kwargs: dict[str, Any], seed: int | None,
              players: int = 1) -> Game:
        """The game made and reset with ``seed`` for ``players`` players."""
        game = cls(game_id, seed)
        with game.own_random():
            game.env = make(game_id, kwargs)
            game.env.reset(num_players=players, seed=seed)
            game.first = render(game.env.get_observation()[1])
        return game

    @contextlib.contextmanager
    def own_random(self) -> Iterator[None]:
        """Python's (and numpy's) global random state swapped for the game's meanwhile."""
        numpy = sys.modules.get("numpy")
        with _RNG_LOCK:
            outer = random.getstate()
            outer_np = None if numpy is None else numpy.random.get_state()
            random.setstate(self._random)
            if numpy is not None and self._numpy is not None:
                numpy.random.set_state(self._numpy)
            try:
                yield
            finally:
                self._random = random.getstate()
                random.setstate(outer)
                if numpy is not None:
                    self._numpy = numpy.random.get_state()
                    numpy.random.set_state(outer_np)

    @property
    def state(self) -> Any:
        return self.env.state

    def step(self, move: str) -> Step:
        """The model's reply as the player's move."""
        with self.own_random():
            done = bool(self.env.step(move)[0]) or bool(self.state.done)
            refused = not done and getattr(self.state, "error_count", 0) > 0
            text = "" if done else render(self.env.get_observation()[1])
        return Step(done, refused, text)

    def reward(self) -> float:
        """Player 0's reward of the finished game (textarena's ``state.rewards``)."""
        value = (self.state.rewards or {}).get(0)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RuntimeError(f"textarena:{self.game_id} ended without a number as player 0's "
                               f"reward ({self.state.rewards!r}): a fault of the game")
        return float(value)

    def close(self) -> None:
        with self.own_random():
            self.env.close()


def check(game_id: str, kwargs: dict[str, Any], seed: int) -> Game:
    """One game started as an episode starts it, or a ValueError saying why it cannot be
    (module docstring)."""
    ta = library()
    registry = ta.envs.registration.ENV_REGISTRY
    if game_id not in registry:
        close = difflib.get_close_matches(game_id, list(registry), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"textarena: no game {game_id!r} in textarena's registry{hint}; "
                         "the single-player games: docs/environments/textarena.md")
    try:
        game = Game.start(game_id, kwargs, seed)
    except Exception as exc:  # noqa: BLE001 - every failure is refused, saying why
        raise ValueError(refusal(game_id, kwargs, exc)) from None
    if not isinstance(game.state, ta.SinglePlayerState):
        raise ValueError(multi_player(game_id))
    if game.state.done:
        raise ValueError(f"textarena:{game_id}: the game is over at reset: nothing to play")
    return game


def multi_player(game_id: str) -> str:
    return (f"textarena:{game_id} is a multi-player game: the adapter plays single-player "
            "games (the model is player 0, there is no one to play the others)")


def refusal(game_id: str, kwargs: dict[str, Any], exc: Exception) -> str:
    """Why starting ``game_id`` failed with ``exc``, for the user."""
    text = str(exc).strip()
    if isinstance(exc, LookupError) and "nltk" in text.lower():
        found = re.search(r"Resource\W+([\w./-]+)", text)
        name = found.group(1) if found else "its data"
        return (f"textarena:{game_id} needs NLTK data that is not installed here ({name}): "
                "textarena downloads it when the game is made, and that failed. Download it "
                f"where the network is reachable (python -m nltk.downloader {name}; "
                "NLTK_DATA names the folder), or play a game that needs no download: "
                "docs/environments/textarena.md")
    if _plays_with_others(game_id, kwargs):
        return multi_player(game_id)
    if isinstance(exc, TypeError) and kwargs:
        return (f"textarena:{game_id} does not take these game settings "
                f"({', '.join(sorted(kwargs))}): {text}")
    first = text.splitlines()[0] if text else ""
    return f"textarena:{game_id} cannot start here: {type(exc).__name__}: {first}"[:600]


def _plays_with_others(game_id: str, kwargs: dict[str, Any]) -> bool:
    """Whether the game starts with 2 to ``MOST_PLAYERS`` players (it failed with one)."""
    for players in range(2, MOST_PLAYERS + 1):
        try:
            Game.start(game_id, kwargs, 0, players=players)
        except Exception:  # noqa: BLE001 - not with this many
            continue
        return True
    return False
