"""``UpConfig(env=[...], env_args=[...])``, the Python API's ``gspo up --env``: specs with
their weights are taken as given, and a malformed spec, weight or argument is refused when the
config is made, before anything starts, saying why. Pure: nothing is loaded or started."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gspo_rl.launch.config import UpConfig


def make(tmp_path: Path, **fields: object) -> UpConfig:
    return UpConfig(run_dir=tmp_path, **fields)


def test_specs_with_weights_and_arguments_are_taken(tmp_path: Path) -> None:
    env = ["alphabet@2", "path/to/my_env.py:MyEnv@0.5", "verifiers:math_taskset",
           "reasoning-gym:leg_counting:2,basic_arithmetic@3", "openenv:http://u@h:8000"]
    args = ["alphabet:turns=2", "MyEnv:level=3", "math_taskset:sampling.max_tokens=8",
            "leg_counting+basic_arithmetic:size=50", "h:8000:max_turns=4"]
    cfg = make(tmp_path, env=env, env_args=args)
    assert cfg.env == env and cfg.env_args == args


def test_one_environment_takes_bare_arguments(tmp_path: Path) -> None:
    assert make(tmp_path, env=["calculator"], env_args=["seed=1"]).env_args == ["seed=1"]
    # --tasks reasoning-gym:... is an environment too
    cfg = make(tmp_path, tasks="reasoning-gym:leg_counting", env_args=["size=20"])
    assert cfg.env == [] and cfg.env_args == ["size=20"]


def test_the_toml_file_and_the_flags_are_checked_alike(tmp_path: Path) -> None:
    toml = tmp_path / "up.toml"
    toml.write_text('env = ["alphabet@0"]\n')
    with pytest.raises(ValidationError, match="the weight after @ must be a finite number > 0"):
        UpConfig.from_toml(toml, run_dir=tmp_path)
    toml.write_text('env = ["alphabet@2", "calculator"]\nenv_args = ["calculator:seed=1"]\n')
    assert UpConfig.from_toml(toml, run_dir=tmp_path).env == ["alphabet@2", "calculator"]


@pytest.mark.parametrize(("fields", "says"), [
    ({"env": ["alphabet@0"]}, "the weight after @ must be a finite number > 0"),
    ({"env": ["alphabet@-2"]}, "the weight after @ must be a finite number > 0"),
    ({"env": ["alphabet@inf"]}, "the weight after @ must be a finite number > 0"),
    ({"env": [""]}, "name an environment"),
    ({"env": ["@3"]}, "name an environment"),
    ({"env": "alphabet"}, "Input should be a valid list"),
    ({"env_args": ["seed=1"]}, r"env_args \(--env-arg\) go with env"),
    ({"env": ["alphabet"], "env_args": ["seed"]}, "expected key=value"),
    ({"env": ["alphabet"], "env_args": ["a..b=1"]}, "must not be empty"),
    ({"env": ["alphabet", "calculator"], "env_args": ["seed=1"]},
     "several environments run; address one as NAME:key=value"),
    ({"env": ["alphabet", "calculator"], "env_args": ["MyEnv:seed=1"]},
     "no environment is named 'MyEnv'"),
])
def test_a_bad_spec_or_argument_is_refused_saying_why(tmp_path: Path, fields: dict,
                                                      says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        make(tmp_path, **fields)
