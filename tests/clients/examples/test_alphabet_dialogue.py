"""The multi-turn example (``alphabet_dialogue``): its rewards with and without per-turn
credit, and whole episodes on a real server (the hf engine on the tiny model, real Redis):
one trajectory per episode with one model turn per ask, the reward the share answered right."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import redis

from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.examples.alphabet import HALVES
from gspo_rl.client.examples.alphabet_dialogue import (
    AlphabetDialogueEnvironment,
    feedback,
)
from gspo_rl.client.loading import load_environment
from gspo_rl.client.runner import arun_groups
from gspo_rl.contract.schema import Keys, unpack_rollout
from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, running_server


def test_the_reward_is_the_share_of_turns_answered_right() -> None:
    env = AlphabetDialogueEnvironment(turns=3)
    assert env.result([True, False, True]).reward == pytest.approx(2 / 3)
    assert env.result([True, True, True]).correct is True
    assert env.result([True, False, True]).turn_rewards is None


def test_with_turn_credit_each_turn_earns_its_own() -> None:
    env = AlphabetDialogueEnvironment(turns=3, turn_credit=True)
    out = env.result([True, False, True])
    assert (out.reward, out.turn_rewards, out.correct) == (1.0, [1 / 3, 0.0, 0.0], False)


def test_tasks_ask_a_half_per_turn_and_feedback_names_the_letter() -> None:
    env = AlphabetDialogueEnvironment(turns=4)  # alternate: the half follows the turn
    assert env.sample_task(random.Random(0)).halves == ("a to m", "n to z") * 2
    env = AlphabetDialogueEnvironment(turns=4, order="random")
    tasks = [env.sample_task(random.Random(s)) for s in range(20)]
    assert all(len(t.halves) == 4 and set(t.halves) <= set(HALVES) for t in tasks)
    assert len({t.halves for t in tasks}) > 2
    with pytest.raises(ValueError, match="order"):
        AlphabetDialogueEnvironment(order="sorted")
    assert feedback("  Zebra", "a to m", False) == "Wrong: 'z', asked a to m."
    assert feedback("42", "n to z", False) == "Wrong: no letter, asked n to z."
    with pytest.raises(ValueError, match="turns"):
        AlphabetDialogueEnvironment(turns=0)
    env2 = load_environment("alphabet_dialogue", group_size=2, args={"turns": 3})
    assert isinstance(env2, AlphabetDialogueEnvironment) and (env2.turns, env2.group_size) == (
        3, 2)


def test_episodes_on_a_real_server_are_one_trajectory_of_one_turn_per_ask(
        tiny_model_dir: Path, redis_server: RedisServer) -> None:
    env = AlphabetDialogueEnvironment(group_size=4, turns=3, max_tokens=4)
    with running_server(tiny_model_dir, redis_server.url) as served:
        async def play() -> list:
            async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
                return await arun_groups(env, client, 3, concurrency=3, seed=1)

        outcomes = asyncio.run(play())
    assert len(outcomes) == 3
    r, keys = redis.Redis.from_url(redis_server.url), Keys()
    for o in outcomes:
        assert all(x in (0.0, 1 / 3, 2 / 3, 1.0) for x in o.rewards)
        for rid in o.rollout_ids:
            rec = unpack_rollout(r.get(keys.rollout(rid)))
            assert len(rec.turns) == 3  # one model turn per ask, in one trajectory
    r.close()
