"""docs/deployment/compose.md's environment section, checked against docker-compose.yml without
a Docker engine: each ``.env`` example, filled into the environment service's command as
compose and ``sh -c`` would (``tests.helpers.compose``), parses with the real ``gspo env``
parser into specs and ``--env-arg`` items the loader takes; the override file that mounts
``my_env.py`` is valid Compose, names a real environment service and mounts the file
``GSPO_ENV`` names; the ``docker compose run`` line runs that service against its profile's
server with the same file mounted."""

from __future__ import annotations

import json
import os
import re
import shlex
from typing import Any

import jsonschema
import pytest
import typer.main
import yaml

from gspo_rl.cli import app
from gspo_rl.client.loading import parse_spec, with_args
from tests.helpers.compose import (
    ENV_EXAMPLE,
    REPO,
    SCHEMA_FILE,
    gspo_argv,
    interpolate,
    load_compose,
    mount_for,
    parse_dotenv,
)

DOC = REPO / "docs" / "deployment" / "compose.md"
SERVERS = {"env": "server", "env-gpu1": "server-gpu1", "env-cpu": "server-cpu"}


def section() -> str:
    text = DOC.read_text()
    start = text.index("## The environment: `GSPO_ENV`")
    return text[start:text.index("\n## ", start + 1)]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section(), re.S)


def dotenv_examples() -> list[dict[str, str]]:
    return [parse_dotenv(b) for b in blocks("bash") if re.match(r"GSPO_\w+=", b)]


@pytest.fixture(autouse=True)
def no_gspo_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GSPO_* variable of this machine reaches click (it reads some options from them)."""
    for k in list(os.environ):
        if k.startswith("GSPO_"):
            monkeypatch.delenv(k)


def parse_env_command(argv: list[str]) -> dict[str, Any]:
    assert argv and argv[0] == "env", argv
    sub = typer.main.get_command(app).commands["env"]  # type: ignore[attr-defined]
    return dict(sub.make_context("env", list(argv[1:])).params)


def env_argv(service: str, values: dict[str, str]) -> list[str]:
    """The ``gspo env`` argv of ``service`` with ``.env.example`` overridden by ``values``."""
    env = {**parse_dotenv(ENV_EXAMPLE.read_text()), **values}
    argv = gspo_argv(interpolate(load_compose()["services"][service]["command"], env))
    assert argv is not None
    return argv


def check_specs(params: dict[str, Any]) -> list[str]:
    specs = with_args([parse_spec(n) for n in params["names"]], list(params["env_arg"] or []))
    return [s.spec for s in specs]


def test_the_section_has_its_examples() -> None:
    assert len(dotenv_examples()) == 2 and len(blocks("yaml")) == 1
    for name in ("GSPO_ENV", "GSPO_ENV_ARGS", "GSPO_EXTRAS"):
        assert f"| `{name}` |" in section()


@pytest.mark.parametrize("service", sorted(SERVERS))
def test_each_dotenv_example_makes_a_gspo_env_command_the_loader_takes(service: str) -> None:
    for values in dotenv_examples():
        params = parse_env_command(env_argv(service, values))
        assert check_specs(params) == values["GSPO_ENV"].split()
        assert params["url"] == f"http://{SERVERS[service]}:8000"


def test_env_args_are_split_and_quoted_as_a_shell_does() -> None:
    argv = env_argv("env-cpu", {"GSPO_ENV": "alphabet", "GSPO_ENV_ARGS":
                                "--env-arg 'system_prompt=Answer in one word.' --seed 3"})
    params = parse_env_command(argv)
    assert params["env_arg"] == ["system_prompt=Answer in one word."] and params["seed"] == 3
    assert "`--env-arg 'system_prompt=Answer in one word.'`" in section()


def test_the_override_mounts_the_file_gspo_env_names() -> None:
    raw = load_compose()
    override = yaml.safe_load(blocks("yaml")[0])
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.validators.validator_for(schema)(schema).validate(override)
    [(name, svc)] = override["services"].items()
    assert name in SERVERS and gspo_argv(raw["services"][name]["command"])[0] == "env"
    assert "volumes" not in raw["services"][name], "docker-compose.yml mounts nothing there"
    path = dotenv_examples()[1]["GSPO_ENV"].rpartition(":")[0]
    mount = mount_for(svc, path)
    assert mount is not None and mount.type == "bind" and mount.read_only
    assert mount.source == "./" + path.rsplit("/", 1)[1]  # my_env.py beside the compose file
    merged = {**raw, "services": {**raw["services"],
                                  name: {**raw["services"][name], **svc}}}
    jsonschema.validators.validator_for(schema)(schema).validate(merged)


def test_the_run_line_runs_the_service_on_the_mounted_file() -> None:
    [line] = [b for b in blocks("bash") if "docker compose" in b]
    argv = shlex.split(line.replace("\\\n", " "))
    assert argv[:5] == ["docker", "compose", "--profile", "cpu", "run"]
    service = next(a for a in argv[5:] if not a.startswith("-") and "/" not in a)
    assert service in load_compose()["services"] and service in SERVERS
    mount = argv[argv.index("-v") + 1]
    source, target, mode = mount.split(":")
    assert source == "$PWD/my_env.py" and mode == "ro"
    params = parse_env_command(argv[argv.index("gspo") + 1:])
    assert [s.rpartition(":")[0] for s in check_specs(params)] == [target]
    assert params["url"] == f"http://{SERVERS[service]}:8000"
