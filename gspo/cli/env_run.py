"""``gspo env`` below its flags: the environment the command line names, a reachable server
first, then the run, and every way it ends in one line (``EnvRunError``, exit 1 or 2), not a
traceback: a server that cannot be reached, a key it refuses, an error the failure policy
gave up on. The run itself: ``gspo_rl.client.runlog.run_and_print``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class EnvRunError(Exception):
    """``gspo env`` stops, saying this one line; ``code`` is its exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class EnvRun:
    """What ``gspo env``'s flags ask for (the CLI's names)."""

    names: list[str]
    url: str
    env_args: list[str] = field(default_factory=list)
    groups: int = 0
    group_size: int | None = None
    concurrency: int = 4
    seed: int = 0
    on_error: str = "retry"
    max_retries: int = 1
    data: list[str] = field(default_factory=list)
    verifier: str | None = None
    eval_data: list[str] = field(default_factory=list)
    eval_every: int | None = None
    eval_out: str | None = None
    evaluate: bool = True
    out: str | None = None
    summary_every_s: float = 10.0
    target_reward: float | None = None


def build(run: EnvRun) -> tuple[Any, Any]:
    """(environment, eval watcher or None); ``EnvRunError`` (exit 2) for a bad command line."""
    from gspo_rl.cli.tasks import is_task_file, task_config, watcher_for

    if len(run.names) > 1 or run.env_args:
        return _environments(run)
    name = run.names[0]
    try:
        if name == "data" or is_task_file(name) or run.data:
            if name not in ("data", "alphabet") and not is_task_file(name):
                raise ValueError(f"--data goes with `gspo env data` or a task file, not {name!r}")
            cfg = task_config(name if is_task_file(name) else None, run.data, run.verifier,
                              run.eval_data, run.eval_every, run.group_size)
            if cfg is None:
                raise ValueError("gspo env data needs --data PATH (or name a task file)")
            from gspo_rl.client.tasks import build_environment

            watcher = watcher_for(cfg, Path(run.eval_out) if run.eval_out else None) \
                if run.evaluate else None
            return build_environment(cfg), watcher
        return _environments(run)
    except (ValueError, ImportError) as exc:
        raise EnvRunError(str(exc), code=2) from exc


def _environments(run: EnvRun) -> tuple[Any, Any]:
    """Environment specs (``gspo_rl.client.loading``): one, or a ``Mix``; with the eval
    watcher of their eval sets (``gspo_rl.launch.workload``)."""
    from gspo_rl.cli.tasks import TaskConfigError, is_task_file
    from gspo_rl.client.loading import BUILTIN
    from gspo_rl.launch.workload import environments_workload

    if run.eval_data or run.verifier or run.data or any(map(is_task_file, run.names)):
        raise EnvRunError("--data, --verifier, --eval-data and task files go with one "
                          "environment (gspo env data | gspo env tasks.toml)", code=2)
    size = run.group_size if run.group_size is not None else (
        8 if all(n in BUILTIN for n in run.names) else None)
    try:
        work = environments_workload(run.names, run.env_args, size, run.eval_every,
                                     Path(run.eval_out) if run.eval_out else None)
    except (TaskConfigError, ValueError, ImportError, OSError) as exc:
        raise EnvRunError(str(exc), code=2) from exc
    return work.env, work.watcher if run.evaluate else None


def check_server(url: str, api_key: str | None) -> None:
    """The server answers ``/health`` and takes the key (``GET /v1/models``), within a few
    seconds; else ``EnvRunError`` saying which and what to do."""
    from gspo_rl.client.client import GSPOClient, RetryPolicy
    from gspo_rl.client.errors import AuthenticationError, GSPOError, ServerUnavailable

    try:
        with GSPOClient(url, api_key=api_key, timeout_s=10,
                        retry=RetryPolicy(attempts=3, admission_patience_s=0)) as client:
            client.health()
            client.models()
    except ServerUnavailable as exc:
        raise EnvRunError(f"gspo env: the rollout server at {url} is not reachable or not "
                          f"ready ({_cause(exc)}); start one (gspo serve) or pass its "
                          "--url") from None
    except AuthenticationError:
        raise EnvRunError(f"gspo env: the server at {url} refused the API key: set "
                          "GSPO_API_KEY to its key") from None
    except GSPOError as exc:
        raise EnvRunError(f"gspo env: the server at {url} answered {exc.status}: "
                          f"{exc.message}") from None


def _cause(exc: BaseException) -> str:
    inner = exc.__cause__ or exc
    return f"{type(inner).__name__}: {inner}" if str(inner) else type(inner).__name__


def run_env(run: EnvRun) -> list[str]:
    """Runs the environment; returns the eval watcher's report lines."""
    from gspo_rl.client.errors import GSPOError
    from gspo_rl.client.failures import FailurePolicy
    from gspo_rl.client.runlog import run_and_print

    environment, watcher = build(run)
    try:
        policy = FailurePolicy(on_error=run.on_error,  # type: ignore[arg-type]  # a str: FailurePolicy checks it (ValueError)
                               max_retries=run.max_retries)
    except ValueError as exc:
        raise EnvRunError(str(exc), code=2) from exc
    api_key = os.environ.get("GSPO_API_KEY")
    check_server(run.url, api_key)
    try:
        run_and_print(environment, run.url, run.groups or None, api_key=api_key,
                      concurrency=run.concurrency, seed=run.seed, failures=policy,
                      alongside=watcher.run if watcher is not None else None,
                      out=Path(run.out) if run.out else None,
                      summary_every_s=run.summary_every_s,
                      target_reward=run.target_reward or None)
    except GSPOError as exc:
        raise EnvRunError(f"gspo env: stopped: {type(exc).__name__}: {exc}") from None
    return [report.line() for report in watcher.reports] if watcher is not None else []
