"""The TextArena adapter with the real textarena package (games that need no download) and the
real rollout server (hf engine on the tiny model, real Redis, the official openai client in the
episodes).

Checked: groups of GuessTheNumber-v0 and TowerOfHanoi-v0 are multi-turn episodes as long as the
game (replayed with plain textarena from the seed and the model's replies: the same number of
moves, the same end, the same reward as the one posted); each turn's token ids stored in Redis
are the ids the chat response returned; a group's games are one seeded game; a game's random
draws are its own (interleaved games of one seed stay identical); a scripted game is won with
reward 1; evaluation plays the held-out seeds unrecorded; and ``load`` refuses, saying why, an
unknown id, a multi-player game, one that needs NLTK data, one that cannot start, bad settings
and a missing textarena.
"""

from __future__ import annotations

import asyncio
import copy
import random
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import textarena as ta

from gspo_rl.client.adapters import AdapterUnavailable, load_adapter
from gspo_rl.client.adapters.textarena import (
    SYSTEM_PROMPT,
    Game,
    TextArenaEnvironment,
    load,
)
from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.environment import EpisodeResult, EpisodeSession, GroupOutcome
from gspo_rl.client.evals import evaluate
from gspo_rl.client.runner import arun_groups
from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, RedisKeys, Served
from tests.helpers.spies import spy_on_chat

GAMES = {"GuessTheNumber-v0": ({"max_turns": 3, "min_number": 0, "max_number": 999}, 1),
         "TowerOfHanoi-v0": ({"max_turns": 4}, 6)}
"""The games played through the server: game settings that keep them short, and max_tokens.
A one-token reply of the tiny model is often a number, a valid guess (the game brackets a
reply that has no brackets), so GuessTheNumber's rewards vary."""


@pytest.fixture(scope="module")
def r(redis_mod: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_mod.url, socket_timeout=10)
    yield c
    c.close()


def spy_on_games(monkeypatch: pytest.MonkeyPatch,
                 env: TextArenaEnvironment) -> dict[str, dict[str, Any]]:
    """Per rollout id: the game its episode played and that game's state at reset."""
    games: dict[str, dict[str, Any]] = {}
    real = env.play_game

    async def play_game(game: Game, session: EpisodeSession) -> EpisodeResult:
        games[str(session.rollout_id)] = {"game": game,
                                          "start": copy.deepcopy(game.state.game_state)}
        return await real(game, session)

    monkeypatch.setattr(env, "play_game", play_game)
    return games


def check_tokens(calls: list[dict[str, Any]]) -> None:
    """After the k-th chat completion of an episode its record holds k model turns, the k-th
    exactly the token ids the response returned, the earlier ones unchanged."""
    ids_by_rid: dict[str, list[list[int]]] = {}
    for call in calls:
        choice = call["response"].choices[0]
        turns = ids_by_rid.setdefault(call["rid"], [])
        turns.append(choice.model_extra["token_ids"])
        rec = call["record"]
        assert len(rec.turns) == len(turns)
        assert [rec.token_ids[s:e].tolist() for s, e in rec.turns] == turns
        assert rec.token_ids.tolist() == choice.model_extra["prompt_token_ids"] + turns[-1]


def replay(game_id: str, kwargs: dict[str, Any], seed: int,
           moves: list[str]) -> tuple[Any, list[bool], Any]:
    """The game played again with plain textarena (its own wrappers, the global random):
    its state at reset, ``done`` after each move (up to the end), its rewards."""
    env = ta.make(env_id=game_id, **kwargs)
    env.reset(num_players=1, seed=seed)
    start = copy.deepcopy(env.state.game_state)
    dones: list[bool] = []
    for move in moves:
        dones.append(bool(env.step(move)[0]))
        if dones[-1]:
            break
    return start, dones, env.state.rewards


def run_groups(served: Served, env: Any, n: int) -> list[GroupOutcome]:
    async def main() -> list[GroupOutcome]:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await arun_groups(env, client, n, concurrency=2, seed=7)

    return asyncio.run(main())


@pytest.mark.parametrize("game_id", list(GAMES))
def test_groups_play_seeded_games_token_exact(served: Served, r: redis.Redis, game_id: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    settings, max_tokens = GAMES[game_id]
    env = load_adapter(f"textarena:{game_id}", {
        "group_size": 2, "max_turns": 8, "game": settings,
        "sampling": {"max_tokens": max_tokens}})
    assert isinstance(env, TextArenaEnvironment) and env.name == game_id
    calls, games = spy_on_chat(monkeypatch, r), spy_on_games(monkeypatch, env)
    outcomes = run_groups(served, env, 3)
    assert len(outcomes) == 3 and len({o.task for o in outcomes}) == 3
    lengths = []
    for o in outcomes:
        meta = asyncio.run(group_view(served, o.group_id))["metadata"]
        assert meta == {"source": "textarena", "task_id": f"{game_id}/{o.task}"}
        for rid, reward, turns in zip(o.rollout_ids, o.rewards, o.turn_rewards, strict=True):
            mine = [c for c in calls if c["rid"] == rid]
            moves = [c["response"].choices[0].message.content or "" for c in mine]
            start, dones, rewards = replay(game_id, settings, o.task, moves)
            assert games[rid]["start"] == start  # the group's seed is the game
            over = dones[-1]  # played to the game's end, or to max_turns
            assert dones[:-1] == [False] * (len(moves) - 1) and (over or len(moves) == 8)
            assert reward == (rewards[0] if over else 0.0) and turns == [0.0] * len(moves)
            first = mine[0]["messages"]
            assert first[0] == {"role": "system", "content": SYSTEM_PROMPT}
            assert first[1]["role"] == "user" and first[1]["content"] == games[rid]["game"].first
            last = mine[-1]["messages"]  # the whole conversation, replies as returned
            assert [m["content"] for m in last if m["role"] == "assistant"] == moves[:-1]
            lengths.append(len(moves))
        starts = [games[rid]["start"] for rid in o.rollout_ids]
        assert starts == [starts[0]] * len(starts)
    assert max(lengths) > 1  # multi-turn: the game went on after a move
    check_tokens(calls)


async def group_view(served: Served, group_id: str) -> dict[str, Any]:
    async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
        return await client.group(group_id)


def test_a_scripted_game_is_won() -> None:
    env = load("GuessTheNumber-v0", {"game": {"max_number": 100, "max_turns": 10}})
    game = env.start(12345)
    assert "Guess The Number" in game.first and "[5]" in game.first
    refused = game.step("no number here")
    assert (refused.done, refused.refused) == (False, True)
    assert "invalid move" in refused.text and "no number" not in refused.text
    low, high, step = 1, 100, None
    while step is None or not step.done:
        guess = (low + high) // 2
        step = game.step(f"I guess [{guess}]")
        assert not step.refused
        if "higher" in step.text:
            low = guess + 1
        elif "lower" in step.text:
            high = guess - 1
    assert game.reward() == 1.0 and game.state.game_state["game_number"] == guess


def test_a_games_random_draws_are_its_own() -> None:
    """Blackjack deals cards as it goes: two games of one seed, stepped in turn with a game of
    another seed and other users of the global random, deal the same hands."""
    env = load("Blackjack-v0", {})
    a, b, other = env.start(5), env.start(5), env.start(6)
    assert a.first == b.first != other.first
    outer = random.getstate()
    for move in ["[hit]", "[stand]"] * 3:
        seen_a = a.step(move)
        other.step(move)
        random.random()
        assert b.step(move) == seen_a
    assert random.getstate() != outer  # the process's own draws went on, untouched


def test_evaluation_plays_the_held_out_seeds_unrecorded(served: Served,
                                                        rkeys: RedisKeys) -> None:
    env = load("GuessTheNumber-v0", {"eval_size": 2, "eval_seed": 40, "max_turns": 2,
                                     "sampling": {"max_tokens": 4}})
    assert env.eval_tasks() == [40, 41]

    class Draws(random.Random):
        values = iter([41, 40, 42])

        def randrange(self, *args: Any, **kwargs: Any) -> int:
            return next(self.values)

    assert env.sample_task(Draws()) == 42  # a training draw skips the held-out seeds
    before = rkeys.snapshot()

    async def main() -> Any:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await evaluate(env, client, env.eval_tasks(), samples=1)

    report = asyncio.run(main())
    assert rkeys.snapshot() == before and report.metrics["tasks"] == 2


@pytest.fixture
def offline_nltk(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """NLTK with no data and no download (as on a machine without the network)."""
    import nltk

    monkeypatch.setattr(nltk, "download", lambda *a, **k: False)
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    monkeypatch.delenv("NLTK_DATA", raising=False)


@pytest.mark.parametrize(("target", "args", "message"), [
    ("GuesTheNumber-v0", {}, r"no game 'GuesTheNumber-v0'.*did you mean GuessTheNumber-v0"),
    ("TicTacToe-v0", {}, "TicTacToe-v0 is a multi-player game"),
    ("SecretMafia-v0", {}, "SecretMafia-v0 is a multi-player game"),
    ("Wordle-v0", {}, r"needs NLTK data that is not installed here \(words\)"),
    ("GuessWho-v0", {}, "cannot start here: ValueError: OpenRouter API key"),
    ("GuessTheNumber-v0", {"game": {"colour": "red"}}, "does not take these game settings"),
    ("GuessTheNumber-v0", {"temperature": 0.5}, "temperature: Extra inputs"),
    ("GuessTheNumber-v0", {"seed": -1}, "seed must be"),
])
@pytest.mark.usefixtures("offline_nltk")
def test_refusals(target: str, args: dict[str, Any], message: str,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(ValueError, match=message):
        load_adapter(f"textarena:{target}", args)


def test_without_textarena_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "textarena", None)  # import textarena: ImportError
    with pytest.raises(AdapterUnavailable, match=r"gspo-rl\[textarena\]"):
        load_adapter("textarena:GuessTheNumber-v0", {})
