"""The commands that run a process from a config: ``serve``, ``learn``, ``sft`` and ``up``.

Each one validates its settings (defaults < TOML < environment < flags) and reports what is
wrong in one format (``settings_errors``: one line per problem, never the input values, which
may hold keys), exit status 2; then it imports and runs what it needs (the CLI stays light).
``gspo_rl.cli.app`` registers them with their derived flags.
"""

from __future__ import annotations

from typing import Any

import typer


def serve(**params: Any) -> None:
    """Run the rollout server (HTTP API + engine). Unset flags fall back to GSPO_* env vars,
    then to the --config file."""
    from gspo_rl.cli.engine_args import serve_flags

    try:
        flags = serve_flags(params)
    except ValueError as exc:
        typer.echo(f"invalid --vllm-arg: {exc}", err=True)
        raise typer.Exit(2) from exc
    from pydantic import ValidationError

    from gspo_rl.server.config import ServerSettings

    try:
        settings = ServerSettings.from_toml(params["config"], **flags)
    except (ValidationError, OSError, ValueError) as exc:
        # Not str(exc): it would echo the input values, keys included.
        typer.echo("invalid server settings:\n" + settings_errors(exc), err=True)
        raise typer.Exit(2) from exc
    from gspo_rl.logs import configure_logging, log_config

    configure_logging(params["log_level"])
    log_config("gspo serve", settings)
    from gspo_rl.server.api.app import create_app
    from gspo_rl.server.run import run_server

    code = run_server(create_app(settings), host=settings.host, port=settings.port,
                      log_level=params["log_level"], timeout_graceful_shutdown=30,
                      timeout_keep_alive=settings.keep_alive_s)
    if code:  # the engine died (gspo_rl.server.run) or the app failed to start
        raise typer.Exit(code)


def learn(**params: Any) -> None:
    """Run the learner: train on ready groups from Redis, checkpoint, push weights."""
    flags = {k: v for k, v in params.items() if k not in ("config", "log_level")}
    config, log_level = params["config"], params["log_level"]
    import os

    if os.environ.get("GSPO_ADMIN_KEY"):
        flags["admin_key"] = os.environ["GSPO_ADMIN_KEY"]
    from gspo_rl.logs import configure_logging, log_config

    configure_logging(log_level)
    from pydantic import ValidationError

    from gspo_rl.learner.config import LearnerConfig

    try:
        cfg = LearnerConfig.from_toml(config, **flags)
    except (ValidationError, OSError, ValueError) as exc:
        typer.echo("invalid learner settings:\n" + settings_errors(exc), err=True)
        raise typer.Exit(2) from exc
    from gspo_rl.learner.tracking.base import TrackingUnavailable, check_installed

    try:
        check_installed(cfg.report_to)
    except TrackingUnavailable as exc:
        typer.echo(f"gspo learn: {exc}", err=True)
        raise typer.Exit(2) from exc
    log_config("gspo learn", cfg)
    from gspo_rl.learner.checkpoint.store import SaveDirError
    from gspo_rl.learner.run import run_learner
    from gspo_rl.learner.runtime.progress import RedisUnavailable

    try:
        state = run_learner(cfg)
    except RedisUnavailable as exc:  # EX_TEMPFAIL: a supervisor restarts it (compose does)
        typer.echo(f"learner stopped: {exc}", err=True)
        raise typer.Exit(75) from exc
    except SaveDirError as exc:
        typer.echo(f"gspo learn: {exc}", err=True)
        raise typer.Exit(2) from exc
    if state is not None:  # None: a data-parallel rank > 0 (rank 0 reports)
        typer.echo(f"stopped at step {state.step}, policy version {state.version}", err=True)


def sft(**params: Any) -> None:
    """Supervised warm start on chat demonstrations (JSONL of messages; the loss on the
    assistant tokens), saved as checkpoints `gspo learn --model` and `gspo serve --model`
    take (docs/sft.md)."""
    flags = {k: v for k, v in params.items() if k not in ("config", "log_level")}
    from gspo_rl.logs import configure_logging, log_config

    configure_logging(params["log_level"])
    from pydantic import ValidationError

    from gspo_rl.learner.sft.config import SFTConfig
    from gspo_rl.learner.tracking.base import TrackingUnavailable, check_installed

    try:
        cfg = SFTConfig.from_toml(params["config"], **flags)
        check_installed(cfg.report_to)
    except (ValidationError, OSError, ValueError, TrackingUnavailable) as exc:
        typer.echo("gspo sft: invalid settings:\n" + settings_errors(exc), err=True)
        raise typer.Exit(2) from exc
    log_config("gspo sft", cfg)
    from gspo_rl.learner.checkpoint.store import SaveDirError
    from gspo_rl.learner.sft.data import DemonstrationError
    from gspo_rl.learner.sft.train import run_sft

    try:
        result = run_sft(cfg)
    except (DemonstrationError, SaveDirError) as exc:
        typer.echo(f"gspo sft: {exc}", err=True)
        raise typer.Exit(2) from exc
    if result.checkpoint is None:
        typer.echo(f"nothing trained (step {result.steps} of the run)", err=True)
        return
    typer.echo(f"trained {result.steps} steps; the model: {result.checkpoint}\n"
               f"RL from it: gspo learn --model {result.checkpoint} --save-dir <new dir> ..."
               f"\n     serve it: gspo serve --model {result.checkpoint} ...")


def up(**params: Any) -> None:
    """Start Redis, a rollout server, the learner and the demo environment (or tasks from
    data, --tasks / --data, or your environments, --env); train; plot."""
    from pathlib import Path

    from pydantic import ValidationError

    from gspo_rl.cli.options import generate
    from gspo_rl.cli.tasks import TaskConfigError
    from gspo_rl.launch.run_dir import RunDirError, previous_settings
    from gspo_rl.launch.up import UP_DEFAULTS, UpConfig, run_up

    spec = generate()["up"]
    flags: dict[str, Any] = {spec[k]["field"]: (v or None) if isinstance(v, list | bool) else v
                             for k, v in params.items() if k in spec}  # [] / False: not given
    try:
        defaults = UP_DEFAULTS
        if flags.get("resume"):
            where = flags.get("run_dir") or UP_DEFAULTS["run_dir"]
            defaults = {**UP_DEFAULTS, **previous_settings(Path(where))}
        cfg = UpConfig.from_toml(params["config"], defaults=defaults, **flags)
    except RunDirError as exc:
        typer.echo(f"gspo up: {exc}", err=True)
        raise typer.Exit(2) from None
    except (ValidationError, OSError, ValueError) as exc:
        typer.echo("gspo up: invalid settings:\n" + settings_errors(exc), err=True)
        raise typer.Exit(2) from None
    _run_up(cfg, run_up, (RunDirError, TaskConfigError))


def _run_up(cfg: Any, run_up: Any, refusals: tuple[type[Exception], ...]) -> None:
    """``run_up(cfg)``, its refusals and an interrupt turned into exit statuses."""
    from gspo_rl.learner.tracking.base import TrackingUnavailable

    try:
        result = run_up(cfg)
    except refusals + (TrackingUnavailable,) as exc:  # (mypy: no starred except tuples)
        typer.echo(f"gspo up: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo("interrupted again: every process killed", err=True)
        raise typer.Exit(130) from None
    for line in result.summary(cfg.target_reward or 0.0):
        typer.echo(line)
    if result.interrupted:
        raise typer.Exit(130)


def settings_errors(exc: Exception) -> str:
    """A settings error, one line per problem (pydantic's without the input values: they may
    hold keys)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return "\n".join(f"  {'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}"
                         for e in exc.errors())
    return f"  {exc}"
