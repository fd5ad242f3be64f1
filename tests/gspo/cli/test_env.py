"""``gspo env path/to/module.py:EnvClass`` runs your own environment (a real server, the CLI
as a subprocess), and says clearly when the spec names no environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gspo_rl.client.loading import load_environment
from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, running_server

ROOT = Path(__file__).resolve().parents[3]
MY_ENV = '''
import random
from gspo_rl.client.environment import SingleTurnEnvironment


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
'''


def _gspo_env(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GSPO_API_KEY": API_KEY, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gspo_rl.cli", "env", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_gspo_env_runs_a_module_file(tmp_path: Path, tiny_model_dir: Path,
                                     redis_server: RedisServer) -> None:
    module = tmp_path / "my_env.py"
    module.write_text(MY_ENV)
    with running_server(tiny_model_dir, redis_server.url) as s:
        r = _gspo_env(f"{module}:CountEnv", "--url", s.url, "--groups", "2",
                      "--concurrency", "1")
    assert r.returncode == 0, r.stderr
    assert "mean reward over 2 groups" in r.stdout
    assert "2 groups completed, 0 failed attempts" in r.stdout


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
