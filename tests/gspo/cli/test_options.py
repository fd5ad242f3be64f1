"""``gspo serve`` / ``gspo learn`` options come from the config models at run time
(gspo_rl.cli.options): the models import without torch, FastAPI or Redis, the flag names stay the
same, and each option's help is its field's docstring."""

from __future__ import annotations

import json
import subprocess
import sys

import typer.main

from gspo_rl.cli import app
from gspo_rl.cli.options import generate
from gspo_rl.launch.config import UpConfig
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.server.config import ServerSettings

SERVE_FLAGS = [
    "--config", "--model", "--engine", "--served-model-name", "--host", "--port", "--redis-url",
    "--key-prefix", "--api-key", "--admin-key", "--insecure-no-auth", "--device",
    "--max-batch-size", "--dtype", "--max-model-len", "--tensor-parallel-size",
    "--gpu-memory-utilization", "--max-lora-rank", "--enforce-eager",
    "--vllm-arg", "--max-n", "--max-tokens", "--max-body-bytes", "--max-ready-groups",
    "--admission", "--admission-wait-s", "--no-signal-hold-s", "--no-signal-drought-s",
    "--admission-capacity-without-learner",
    "--max-episode-turns", "--episode-history-rewrite", "--tool-call-parser",
    "--reasoning-parser", "--group-ttl-s", "--group-idle-s", "--finished-ttl-s",
    "--dropped-records-ttl-s", "--server-id", "--advertise-url",
    "--log-level"]
LEARN_FLAGS = [
    "--config", "--model", "--redis-url", "--key-prefix", "--consumer", "--loss",
    "--old-logprobs", "--is-weight-cap", "--max-staleness", "--groups-per-step",
    "--keep-trained-s", "--minibatches", "--epochs", "--micro-batch-tokens", "--lora-rank",
    "--lora-alpha",
    "--lora-dropout", "--lora-target-modules", "--lr", "--weight-decay", "--grad-clip",
    "--warmup-steps", "--save-dir", "--save-every", "--save-every-s", "--keep-last",
    "--resume", "--sync-every", "--weight-sync", "--max-steps", "--target-reward",
    "--target-window", "--drain-timeout-s", "--read-timeout-s", "--device", "--param-dtype",
    "--data-parallel",
    "--seed", "--metrics-jsonl", "--report-to", "--run-name", "--tracking-project",
    "--tracking-dir", "--samples-every", "--prometheus-port", "--final-eval-wait-s",
    "--log-level"]
UP_FLAGS = [
    "--config", "--run-dir", "--model", "--redis-url", "--loss", "--max-steps",
    "--groups-per-step", "--group-size", "--tasks", "--env", "--env-arg", "--selection",
    "--no-signal-hold-s", "--no-signal-drought-s", "--resume", "--data", "--verifier",
    "--eval-every", "--lr",
    "--lora-rank", "--read-timeout-s", "--max-staleness", "--concurrency", "--minutes",
    "--target-reward", "--seed", "--device", "--engine", "--admission", "--report-to",
    "--run-name"]


def test_the_config_models_import_without_torch_fastapi_or_redis() -> None:
    probe = ("import json, sys; import gspo_rl.cli, gspo_rl.cli.options as o; o.generate(); "
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
             "{'torch', 'fastapi', 'starlette', 'redis', 'transformers', 'uvicorn'})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_flag_names_and_defaults_are_unchanged() -> None:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name, flags in (("serve", SERVE_FLAGS), ("learn", LEARN_FLAGS), ("up", UP_FLAGS)):
        params = commands[name].params
        assert [p.opts[0] for p in params] == flags
        unset = [p for p in params if p.name != "log_level"]
        assert all(p.default is None for p in unset), name  # unset: the model decides
    resume = next(p for p in commands["learn"].params if p.name == "resume")
    assert resume.secondary_opts == ["--no-resume"]
    up = {p.name: p for p in commands["up"].params}
    assert up["env_arg"].multiple and up["data"].multiple  # repeatable, as before
    assert up["redis_url"].envvar == "REDIS_URL"


def test_up_flags_are_up_configs_fields() -> None:
    """``gspo up``'s options derive from ``UpConfig`` (``--env-arg``: ``env_args``)."""
    spec = generate()["up"]
    assert spec["env_arg"]["field"] == "env_args" and spec["env"]["type"] == "list"
    assert spec["max_steps"]["help"].endswith("(default: 300)")
    assert all(name in UpConfig.model_fields for name in (o["field"] for o in spec.values()))


def test_help_is_the_fields_docstring() -> None:
    spec = generate()
    lr = LearnerConfig.model_fields["lr"].description or ""
    assert spec["learn"]["lr"]["help"].startswith(" ".join(lr.split())[:40])
    assert spec["learn"]["lr"]["type"] == "float"
    port = spec["serve"]["port"]
    assert port["help"].startswith(" ".join((ServerSettings.model_fields["port"].description
                                             or "").split()))
    assert port["help"].endswith("(default: 8000) (env GSPO_PORT)")
    assert spec["serve_after_vllm_arg"]["group_ttl_s"]["field"] == "queue.group_ttl_s"
    assert "GSPO_QUEUE__GROUP_TTL_S" in spec["serve_after_vllm_arg"]["group_ttl_s"]["help"]
    assert "flags show in `ps`" in spec["serve"]["api_key"]["help"]


def test_every_help_fits_80_columns_with_every_flag_whole() -> None:
    """click's plain help (``rich_markup_mode=None``): wrapped to the terminal, never cut."""
    from typer.testing import CliRunner

    runner = CliRunner()
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name in [None, *commands]:
        r = runner.invoke(app, [*([name] if name else []), "--help"], env={"COLUMNS": "80"})
        assert r.exit_code == 0, (name, r.output)
        lines = r.output.splitlines()
        assert max(len(line) for line in lines) <= 80, name
        assert "…" not in r.output, name
        if name is None:  # the command list: whole summaries, not click's cut ones
            assert "..." not in r.output.split("Commands:")[1]
        for param in commands[name].params if name else []:
            for opt in [*param.opts, *param.secondary_opts]:
                assert opt.startswith("-") is False or opt in r.output, (name, opt)


def test_version_flag() -> None:
    from typer.testing import CliRunner

    from gspo_rl import __version__

    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"gspo-rl {__version__}"


def test_help_is_grouped_by_the_config_models_sections() -> None:
    """``gspo serve`` and ``gspo learn`` list their options under the section comments of
    ServerSettings and LearnerConfig, in the models' order, non-field options first."""
    from typer.testing import CliRunner

    runner = CliRunner()
    for command, sections in {
        "learn": {"Model and wiring": "--model", "The objective": "--loss",
                  "Batching": "--epochs", "Metrics": "--report-to"},
        "serve": {"Model and engine": "--vllm-arg", "Network and auth": "--api-key",
                  "Queue (Redis)": "--group-ttl-s"},
    }.items():
        out = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80"}).output
        heads = [line[:-1] for line in out.splitlines() if line and line[0] != " "
                 and line.endswith(":")]
        assert heads[0] == "Options", (command, heads)
        assert [h for h in heads if h in sections] == list(sections), (command, heads)
        for title, flag in sections.items():
            block = out.split(f"\n{title}:\n")[1].split("\n\n")[0]
            assert f"  {flag} " in block, (command, title, flag)
        assert "--config" in out.split("\nOptions:\n")[1].split("\n\n")[0]


def test_up_help_names_each_environment_variable_once() -> None:
    """``REDIS_URL`` was listed twice in ``gspo up --help`` (the flag's help and click's
    ``[env var: ...]``); every variable is named once."""
    from typer.testing import CliRunner

    out = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "80"}).output
    assert out.count("REDIS_URL") == 1, out
