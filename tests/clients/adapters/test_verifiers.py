"""verifiers 0.4 environments (the real ``verifiers`` package, its ``verifiers.v1`` API), run
unmodified against a real rollout server (hf engine on the tiny model, real Redis): three
tasksets defined in ``verifiers_envs/`` (single-turn math, a multi-turn game with its own
``Env``, a tool environment with an MCP tool server), each played by verifiers' own harness
program. Checked: every turn recorded in Redis is, token for token, what the server returned
to the harness; the rewards posted are the traces' rubric rewards; an evaluation runs
unrecorded; what the adapter cannot run is refused with a message that says why."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.evals import evaluate
from gspo_rl.client.loading import load_environment
from gspo_rl.client.runner import arun_groups
from gspo_rl.contract.schema import Keys, unpack_rollout
from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, RedisKeys, Served
from tests.helpers.spies import relay_calls

pytest.importorskip("verifiers.v1", reason="the verifiers extra is not installed")

ENVS = Path(__file__).parent / "verifiers_envs"
KEYS = Keys()
BASE_ARGS = {"group_size": 2, "harness": "null", "sampling": {"max_tokens": 6}}


def spec(name: str) -> str:
    return f"verifiers:{ENVS / name}"


@pytest.fixture
def returned() -> Iterator[dict[str, list[list[int]]]]:
    """The sampled token ids our server returned to the harness, per rollout, in order: a spy
    on the relay (verifiers' chat program streams; the final event of each answer carries the
    sampled ``token_ids``), which passes the request and the answer through unchanged."""
    with relay_calls() as seen:
        yield seen.sampled


@pytest.fixture(scope="module")
def r(redis_mod: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_mod.url, socket_timeout=10)
    yield c
    c.close()


def play(env: Any, served: Served, groups: int) -> list[Any]:
    async def main() -> list[Any]:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await arun_groups(env, client, groups, concurrency=2)

    return asyncio.run(main())


@pytest.mark.parametrize(("name", "turns"), [("gspo_vf_math", 1), ("gspo_vf_guess", 2),
                                             ("gspo_vf_tools", None)])
def test_episodes_are_recorded_token_exact_with_their_rubric_rewards(
        served: Served, r: redis.Redis, returned: dict, name: str, turns: int | None) -> None:
    env = load_environment(spec(name), args={**BASE_ARGS, "taskset": {"turns": 2}}
                           if name == "gspo_vf_guess" else dict(BASE_ARGS))
    outcomes = play(env, served, 2)
    assert len(outcomes) == 2
    for o in outcomes:
        assert o.task.data.id is not None and len(o.rollout_ids) == 2
        for rid, reward in zip(o.rollout_ids, o.rewards, strict=True):
            rec = unpack_rollout(r.get(KEYS.rollout(rid)))
            sampled = [rec.token_ids[a:b].tolist() for a, b in rec.turns]
            assert sampled == returned[rid], "the stored turns are not what the model wrote"
            assert turns is None or len(sampled) == turns
            assert float(r.hget(KEYS.episode(rid), "reward") or reward) == reward
        meta = r.hget(KEYS.group(o.group_id), "metadata")
        assert meta is None or name.encode() in meta


def test_math_rewards_follow_the_rubric(served: Served, returned: dict) -> None:
    env = load_environment(spec("gspo_vf_math"), args=dict(BASE_ARGS))
    (o,) = play(env, served, 1)
    for rid, reward in zip(o.rollout_ids, o.rewards, strict=True):
        assert reward in (0.0, 0.5, 1.0)
        assert returned[rid], "each episode made its model call through the server"


def test_held_out_tasks_are_evaluated_unrecorded(served: Served, rkeys: RedisKeys) -> None:
    args = {**BASE_ARGS, "eval": {"limit": 2}}
    env = load_environment(spec("gspo_vf_math"), args=args)
    held = env.eval_tasks()
    assert [t.data.id for t in held] == ["add-0", "add-1"]
    assert not {t.data.id for t in env.stream.tasks} & {t.data.id for t in held}

    async def main() -> Any:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client, env.serving():
            return await evaluate(env, client, held, samples=1, ks=[1])

    before = rkeys.snapshot()
    report = asyncio.run(main())
    assert report.metrics["tasks"] == 2 and 0.0 <= report.metrics["mean_reward"] <= 1.0
    assert rkeys.snapshot() == before, "an evaluation recorded something"


@pytest.mark.parametrize(("target", "args", "message"), [
    ("no_such_taskset_xyz", {}, "taskset 'no_such_taskset_xyz' not found"),
    ("/nowhere/gspo_vf_none", {}, "no such taskset module"),
    (str(ENVS / "gspo_vf_math") + ':{"n": 0}', {"harness": "null"}, "no task left to train on"),
    (str(ENVS / "gspo_vf_math"), {"player": {}}, "invalid settings"),
    (str(ENVS / "gspo_vf_math"), {"runtime_python": "conda"}, "runtime_python must be"),
    (str(ENVS / "gspo_vf_math") + ":{oops", {}, "not JSON"),
    # verifiers' default harness (bash: a shell tool) in the runtime the adapter picks (this
    # machine): the model's commands would run here unasked
    (str(ENVS / "gspo_vf_math"), {}, "plays the 'bash' harness, which runs the model's "
     r"commands .* agent.runtime.type=docker .* or harness=null"),
    (str(ENVS / "gspo_vf_math"), {"harness": "codex"}, "speaks OpenAI's Responses API"),
    (str(ENVS / "gspo_vf_math"), {"harness": "claude_code", "agent": {"runtime": {
        "type": "docker"}}}, "speaks Anthropic's Messages API"),
])
def test_what_cannot_run_is_refused_at_load(target: str, args: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_environment(f"verifiers:{target}", args=args)


def test_a_shell_harness_runs_here_only_when_its_runtime_is_set() -> None:
    """Asked for by its runtime, the bash harness loads (to run on this machine knowingly, or
    in a container runtime)."""
    env = load_environment(spec("gspo_vf_math"), args={
        "group_size": 2, "agent": {"runtime": {"type": "subprocess"}}})
    assert env.env._agent_harness(env.config.agent).id == "bash"


def test_another_verifiers_version_is_refused_saying_what_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An environment written for the 0.1.x API (SingleTurnEnv, ToolEnv) needs that version
    installed, and the adapter runs 0.4's verifiers.v1: refused at load, saying so."""
    import importlib.metadata

    from gspo_rl.client.adapters.verifiers import hooks

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "0.1.9" if name == "verifiers" else real(name))
    with pytest.raises(ValueError, match=r"verifiers 0.1.9 is installed; gspo runs the 0.4.x "
                                         r"API .*0.1.x SingleTurnEnv/MultiTurnEnv/ToolEnv API "
                                         "is not supported"):
        hooks.check_version()
