"""The OpenEnv adapter against real OpenEnv servers (openenv-core's own app under uvicorn, on
free ports) and the real rollout server (hf engine on the tiny model, real Redis, the official
openai client in the episodes).

Games: ``SayWord`` (text actions: one string field; 3 steps, each rewarded 0.25 per distinct
letter of the seed's word that the reply contains, up to 4), ``Guess`` (an int field: JSON
actions; done on the right number) and ``Forgetful`` (a reset that takes no seed). Checked:
every episode's reward is the sum of the steps the server took and its turn rewards are those
steps, one per chat completion; a group's episodes reset with one seed (its task id); each
turn's token ids stored in Redis are the ids the chat response returned; invalid actions are
turns with the penalty; evaluation plays unrecorded; a server that ignores seeds is named; one
that cannot serve is refused by ``load``, saying why.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
from pydantic import Field

from gspo_rl.client.adapters import load_adapter
from gspo_rl.client.adapters.openenv import OpenEnvEnvironment, load
from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.environment import GroupOutcome
from gspo_rl.client.evals import evaluate
from gspo_rl.client.runner import arun_groups
from tests.conftest import RedisServer, free_port
from tests.helpers.serving import API_KEY, RedisKeys, Served, serve_app
from tests.helpers.spies import spy_on_chat

WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple")
STEPS = 3
LOCK = threading.Lock()
SAID: list[dict[str, Any]] = []  # every step SayWord took, from every session


class SayAction(Action):
    text: str = Field(description="what the player says")


class SayObservation(Observation):
    prompt: str = ""


class _Game(Environment):
    """What the games share: concurrent sessions, a ``State`` per session."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()

    @property
    def state(self) -> State:
        return self._state


class SayWord(_Game):
    def __init__(self) -> None:
        super().__init__()
        self.word, self.seed = "", None

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> SayObservation:
        self.word, self.seed = random.Random(seed).choice(WORDS), seed
        self._state = State(episode_id=episode_id, step_count=0)
        return SayObservation(prompt=f"Say the word {self.word}.")

    def step(self, action: SayAction, timeout_s: float | None = None,  # type: ignore[override]
             **kwargs: Any) -> SayObservation:
        self._state.step_count += 1
        reward = 0.25 * min(4, sum(c in action.text.lower() for c in set(self.word)))
        with LOCK:
            SAID.append({"episode": self._state.episode_id, "seed": self.seed,
                         "text": action.text, "reward": reward})
        done = self._state.step_count >= STEPS
        return SayObservation(prompt=f"Again: say {self.word}.", reward=reward, done=done)


class Forgetful(SayWord):
    """Ignores seeds: its reset takes none (the server passes on only what reset takes)."""

    resets = iter(range(10**6))

    def reset(self, episode_id: str | None = None) -> SayObservation:  # type: ignore[override]
        return super().reset(next(Forgetful.resets), episode_id)


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    feedback: str = ""


class Guess(_Game):
    def __init__(self) -> None:
        super().__init__()
        self.target = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> GuessObservation:
        self.target = random.Random(seed).randint(1, 9)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback="Guess a number from 1 to 9.")

    def step(self, action: GuessAction, timeout_s: float | None = None,  # type: ignore[override]
             **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        right = action.guess == self.target
        hint = "right" if right else ("higher" if action.guess < self.target else "lower")
        return GuessObservation(feedback=hint, reward=1.0 if right else 0.0, done=right)


def _env_server(env: type[Environment], action: type[Action],
                observation: type[Observation], **kwargs: Any) -> Iterator[str]:
    """openenv-core's app for ``env`` under uvicorn: yields its URL."""
    with serve_app(create_fastapi_app(env, action, observation, **kwargs)) as s:
        yield s.url


@pytest.fixture(scope="module")
def say_url() -> Iterator[str]:
    yield from _env_server(SayWord, SayAction, SayObservation, max_concurrent_envs=16)


@pytest.fixture(scope="module")
def guess_url() -> Iterator[str]:
    yield from _env_server(Guess, GuessAction, GuessObservation, max_concurrent_envs=4)


@pytest.fixture(scope="module")
def single_url() -> Iterator[str]:
    """A server that holds one session (openenv's default ``max_concurrent_envs``)."""
    yield from _env_server(SayWord, SayAction, SayObservation)


@pytest.fixture(scope="module")
def forgetful_url() -> Iterator[str]:
    yield from _env_server(Forgetful, SayAction, SayObservation, max_concurrent_envs=8)


@pytest.fixture(scope="module")
def r(redis_mod: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_mod.url, socket_timeout=10)
    yield c
    c.close()


def run_groups(served: Served, env: Any, n: int) -> list[GroupOutcome]:
    async def main() -> list[GroupOutcome]:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await arun_groups(env, client, n, concurrency=2, seed=7)

    return asyncio.run(main())


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
        stored = [rec.token_ids[s:e].tolist() for s, e in rec.turns]
        assert stored == turns
        assert rec.token_ids.tolist() == choice.model_extra["prompt_token_ids"] + turns[-1]


def test_groups_of_text_actions(served: Served, say_url: str, r: redis.Redis,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    env = load_adapter(f"openenv:{say_url}", {"group_size": 3, "max_turns": 5,
                                              "sampling": {"max_tokens": 8}})
    assert isinstance(env, OpenEnvEnvironment) and env.codec.field == "text"
    assert env.observation_field == "prompt" and env.system_prompt is None
    SAID.clear()
    calls = spy_on_chat(monkeypatch, r)
    outcomes = run_groups(served, env, 2)
    assert len(outcomes) == 2 and len(calls) == 2 * 3 * STEPS
    for o in outcomes:
        seeds = {s["seed"] for s in SAID if s["episode"] in o.rollout_ids}
        assert seeds == {o.task}  # one task per group
        meta = asyncio.run(group_view(served, o.group_id))["metadata"]
        assert meta == {"source": "openenv", "task_id": f"{env.name}/{o.task}"}
        for rid, reward, turns in zip(o.rollout_ids, o.rewards, o.turn_rewards, strict=True):
            steps = [s for s in SAID if s["episode"] == rid]
            mine = [c for c in calls if c["rid"] == rid]
            assert turns == [s["reward"] for s in steps] and len(turns) == len(mine) == STEPS
            assert reward == sum(s["reward"] for s in steps)
            replies = [c["response"].choices[0].message.content or "" for c in mine]
            assert [s["text"] for s in steps] == replies  # the reply is the action
            word = random.Random(o.task).choice(WORDS)
            assert mine[0]["messages"] == [{"role": "user", "content": f"Say the word {word}."}]
            last = mine[-1]["messages"]  # the whole conversation, replies as returned
            assert [m["content"] for m in last if m["role"] == "assistant"] == replies[:-1]
    check_tokens(calls)


async def group_view(served: Served, group_id: str) -> dict[str, Any]:
    async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
        return await client.group(group_id)


def test_json_actions_and_invalid_ones(served: Served, guess_url: str, r: redis.Redis,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    env = load(guess_url, {"group_size": 2, "max_turns": 2, "invalid_penalty": 0.5,
                           "sampling": {"max_tokens": 6}, "seed": 3})
    assert env.codec.field is None and '"guess"' in (env.system_prompt or "")
    target = random.Random(3).randint(1, 9)

    async def scripted() -> list[Any]:
        async with env.session(seed=3) as s:
            assert s.first == "Guess a number from 1 to 9."
            return [await s.act(t) for t in ("three", '{"guess": "x"}', '{"guess": 10',
                                             f"```json\n{{\"guess\": {target}}}\n```")]

    bare, wrong_type, broken, right = asyncio.run(scripted())
    for turn in (bare, wrong_type, broken):
        assert (turn.valid, turn.reward, turn.done) == (False, -0.5, False)
    assert "no JSON object" in bare.text and "guess" in wrong_type.text
    assert "not valid JSON" in broken.text
    assert (right.valid, right.reward, right.done, right.text) == (True, 1.0, True, "right")
    calls = spy_on_chat(monkeypatch, r)
    [outcome] = run_groups(served, env, 1)  # the tiny random model writes no JSON
    assert outcome.task == 3 and outcome.rewards == [-1.0, -1.0]
    assert outcome.turn_rewards == [[-0.5, -0.5], [-0.5, -0.5]] and len(calls) == 4
    assert outcome.versions == [0, 0]  # the server's version at the group's opening
    second = [c for c in calls if c["rid"] == outcome.rollout_ids[0]][1]
    assert second["messages"][-1]["content"].startswith("Invalid action: ")
    check_tokens(calls)


def test_a_text_field_that_is_not_a_string(guess_url: str) -> None:
    env = load(guess_url, {"group_size": 1, "action_field": "guess", "seed": 3})

    async def two() -> list[Any]:
        async with env.session(seed=3) as s:
            return [await s.act("seven"), await s.act("7")]

    refused, stepped = asyncio.run(two())
    assert not refused.valid and "guess" in refused.text and stepped.valid


def test_evaluation_plays_unrecorded(served: Served, say_url: str, rkeys: RedisKeys) -> None:
    env = load(say_url, {"group_size": 2, "max_turns": 2, "reward": "last",
                         "sampling": {"max_tokens": 4}})
    before = rkeys.snapshot()
    SAID.clear()

    async def main() -> Any:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await evaluate(env, client, [11], samples=1, threshold=0.5)

    report = asyncio.run(main())
    assert rkeys.snapshot() == before and report.metrics["samples"] == 1
    assert [(s["episode"], s["seed"]) for s in SAID] == [(None, 11), (None, 11)]
    assert report.results[0].rewards == [SAID[-1]["reward"]]  # reward="last"


def test_sessions_beyond_the_servers_capacity(single_url: str) -> None:
    with pytest.raises(ValueError, match=r"opened 1 of 2 sessions.*max_concurrent_envs"):
        load(single_url, {"group_size": 2})
    env = load(single_url, {"group_size": 2, "max_sessions": 1})  # episodes queue

    async def both() -> list[str]:
        async def one() -> str:
            async with env.session(seed=1) as s:
                return (await s.act("x")).text
        return await asyncio.gather(one(), one())

    word = random.Random(1).choice(WORDS)
    assert asyncio.run(both()) == [f"Again: say {word}."] * 2


@pytest.mark.parametrize(("target", "args", "message"), [
    ("http://127.0.0.1:{free}", {}, "cannot reach the environment server"),
    ("{served}", {}, "not an OpenEnv environment server"),
    ("envs.echo_env:EchoEnv@{say}", {}, "typed clients"),
    ("127.0.0.1:8001", {}, "not a server URL"),
    ("{say}", {"action_field": "word"}, r"'word' is not a field .*\(its fields: text\)"),
    ("{say}", {"observation_field": "answer"}, r"its fields: prompt"),
    ("{say}", {"action_format": "json", "action_field": "text"}, "action_format=text"),
    ("{guess}", {"action_format": "text"}, "needs action_field"),
    ("{say}", {"group_size": 0}, "group_size"),
    ("{say}", {"temperature": 0.5}, "temperature: Extra inputs"),
])
def test_refusals(served: Served, say_url: str, guess_url: str, target: str,
                  args: dict[str, Any], message: str) -> None:
    spec = "openenv:" + target.format(free=free_port(), served=served.url, say=say_url,
                                      guess=guess_url)
    with pytest.raises(ValueError, match=message):
        load_adapter(spec, args)


def test_a_server_that_ignores_seeds_is_named(forgetful_url: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "gspo_rl.client.adapters.openenv"):
        load(forgetful_url, {"group_size": 4})
    assert "ignores seeds" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, "gspo_rl.client.adapters.openenv"):
        load(forgetful_url, {"group_size": 4, "seed": False})
    assert caplog.text == ""
