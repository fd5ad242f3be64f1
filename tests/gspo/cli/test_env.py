"""``gspo env path/to/module.py:EnvClass`` runs your own environment (a real server, the CLI
as a subprocess), and says clearly when the spec names no environment."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gspo_rl.client.loading import load_environment
from gspo_rl.contract.net import free_port
from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, running_server

ROOT = Path(__file__).resolve().parents[3]
MY_ENV = '''
import random
from openai import AsyncOpenAI
from gspo_rl.client.environment import (EpisodeResult, EpisodeSession, MultiTurnEnvironment,
                                        SingleTurnEnvironment)


class CountEnv(SingleTurnEnvironment):
    group_size = 3
    sampling = {"temperature": 1.0, "max_tokens": 4}

    def sample_task(self, rng: random.Random) -> int:
        return rng.randint(0, 9)

    def prompt(self, task: int) -> str:
        return f"count to {task}"

    def score(self, task: int, completion: str) -> float:
        return float(len(completion) % 2)


not_an_env = 3


class Solved(CountEnv):
    group_size = 2
    sampling = {"temperature": 1.0, "max_tokens": 2}

    def score(self, task: int, completion: str) -> float:
        return 1.0


class TwoTurns(MultiTurnEnvironment):
    group_size = 2

    def sample_task(self, rng: random.Random) -> str:
        return "say a word"

    async def episode(self, task: str, session: EpisodeSession) -> EpisodeResult:
        msgs = [{"role": "user", "content": task}]
        async with AsyncOpenAI(base_url=session.openai_base_url, api_key=session.api_key,
                               max_retries=0) as client:
            for question in ("another one", None):
                c = await client.chat.completions.create(
                    model=session.model, messages=msgs, max_tokens=3,
                    extra_body=session.extra_body)
                if question:
                    msgs += [{"role": "assistant", "content": c.choices[0].message.content},
                             {"role": "user", "content": question}]
        return EpisodeResult(reward=float(len(c.choices[0].message.content or "") % 2),
                             turn_rewards=[0.5, 0.0])
'''


def _gspo_env(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GSPO_API_KEY": API_KEY, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gspo_rl.cli", "env", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_gspo_env_runs_a_module_file_and_keeps_transcripts(
        tmp_path: Path, tiny_model_dir: Path, redis_server: RedisServer) -> None:
    """A live summary line, and every group's transcripts and rewards in --out: single-turn
    from what the environment scored, multi-turn read back from the server (each turn's
    context and text)."""
    module = tmp_path / "my_env.py"
    module.write_text(MY_ENV)
    out = tmp_path / "groups.jsonl"
    with running_server(tiny_model_dir, redis_server.url) as s:
        r = _gspo_env(f"{module}:CountEnv", "--url", s.url, "--groups", "2",
                      "--concurrency", "1", "--out", str(out))
        multi = _gspo_env(f"{module}:TwoTurns", "--url", s.url, "--groups", "1",
                          "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "mean reward over 2 groups" in r.stdout
    assert "2 groups completed, 0 failed attempts" in r.stdout
    assert re.search(r"^\[0:\d\d\] 2 groups  reward \d\.\d{3} \(last 2: ", r.stdout, re.M)
    assert f"transcripts and rewards of 2 groups: {out}" in r.stdout
    assert multi.returncode == 0, multi.stderr
    first, second, episodes = (json.loads(line) for line in out.read_text().splitlines())
    assert first["prompt"] == f"count to {first['task']}" and len(first["samples"]) == 3
    for sample, reward in zip(first["samples"], first["rewards"], strict=True):
        assert sample["reward"] == reward == float(len(sample["text"]) % 2)
        assert sample["policy_version"] == 0
    assert episodes["task"] == "say a word" and len(episodes["samples"]) == 2
    for ep in episodes["samples"]:
        assert ep["turn_rewards"] == [0.5, 0.0] and len(ep["turns"]) == 2
        assert "say a word" in ep["turns"][0]["context"]
        assert "another one" in ep["turns"][1]["context"]


def test_a_learned_task_stops_sampling_at_the_target(tmp_path: Path, tiny_model_dir: Path,
                                                     redis_server: RedisServer) -> None:
    """--groups 0 (until stopped) with --target-reward: no new group once the last 32
    average the target; the run ends by itself, exit 0. Every group was solved by every
    sample (no learning signal): it says so, and why, as the groups end."""
    module = tmp_path / "my_env.py"
    module.write_text(MY_ENV)
    with running_server(tiny_model_dir, redis_server.url) as s:
        r = _gspo_env(f"{module}:Solved", "--url", s.url, "--groups", "0",
                      "--target-reward", "0.9")
    assert r.returncode == 0, r.stderr
    assert "target reward 0.9 reached: the last 32 groups average 1.000" in r.stdout
    done = int(re.search(r"mean reward over (\d+) groups: 1.000", r.stdout).group(1))
    assert 32 <= done <= 32 + 4  # the groups in flight when it stopped (--concurrency 4)
    assert "32 of the last 32 groups carried no learning signal (32 solved by every sample)" \
        in r.stderr, r.stderr[-3000:]


def test_an_unreachable_server_is_one_line() -> None:
    r = _gspo_env("alphabet", "--url", f"http://127.0.0.1:{free_port()}", "--groups", "1")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "is not reachable or not ready (ConnectError" in line and "gspo serve" in line


@pytest.mark.parametrize(("spec", "message"), [
    ("nowhere/missing.py:X", "no such file"),
    ("{module}:not_an_env", "is not a SingleTurnEnvironment"),
    ("{module}:Nope", "cannot load"),
    ("bogus", "unknown environment"),
])
def test_bad_specs_are_refused(tmp_path: Path, spec: str, message: str) -> None:
    module = tmp_path / "my_env.py"
    module.write_text(MY_ENV)
    with pytest.raises(ValueError, match=message):
        load_environment(spec.format(module=module))


def test_group_size_is_set_and_builtins_load(tmp_path: Path) -> None:
    module = tmp_path / "my_env.py"
    module.write_text(MY_ENV)
    assert load_environment(f"{module}:CountEnv").group_size == 3
    assert load_environment(f"{module}:CountEnv", 5).group_size == 5
    assert load_environment("calculator", 2).group_size == 2
    r = _gspo_env("nowhere/missing.py:X")
    assert r.returncode == 2 and "no such file" in r.stderr
