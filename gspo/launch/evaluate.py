"""``gspo eval``: an eval set against a checkpoint (a server started on it, with a Redis of
its own, then stopped) or a running server (``--url``); prints pass@k and mean reward and
writes the whole report (every task's answers) as JSON.

The eval set is the task file's ``[eval]`` (or, without one, its training sources, each task
once), or ``--data`` files; ``--samples``, ``--k``, ``--temperature``, ``--max-tokens`` and
``--limit`` override its settings. Every answer is sampled unrecorded (``"record": false``):
nothing is trained, and a server whose learner has finished still answers.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gspo_rl.cli.tasks import TaskConfigError, task_config
from gspo_rl.contract.net import free_port


class EvalRun(BaseModel):
    """Settings of one ``gspo eval`` (the CLI's flags)."""

    model_config = ConfigDict(extra="forbid")

    tasks: str | None = None
    data: list[str] = Field(default_factory=list)
    verifier: str | None = None
    model: str | None = None
    url: str | None = None
    samples: int | None = Field(None, ge=1)
    k: list[int] = Field(default_factory=list)
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int | None = Field(None, ge=1)
    limit: int | None = Field(None, ge=1)
    out: Path | None = None
    post: bool = False
    device: str | None = None


def resolve_model(path: str) -> Path:
    """A model directory, or the newest checkpoint of a learner's save directory."""
    p = Path(path).expanduser()
    if (p / "config.json").is_file():
        return p
    steps = sorted(c for c in p.glob("step-*") if (c / "learner_state.json").is_file())
    if steps:
        return steps[-1]
    raise TaskConfigError(f"{p} is neither a model directory (config.json) nor a learner's "
                          "save directory (step-*/)")


def eval_config(run: EvalRun) -> Any:
    """The task configuration whose ``eval`` is the set to run, the flags applied."""
    cfg = task_config(run.tasks, run.data or None, run.verifier)
    if cfg is None:
        raise TaskConfigError("name the eval set: a task file, or --data PATH")
    ev = cfg.eval.model_dump() if cfg.eval is not None and not run.data else {
        "name": cfg.name, "sources": [s.model_dump() for s in cfg.sources],
        "sampling": cfg.sampling.model_dump()}
    if run.samples is not None:
        ev["samples"] = run.samples
    if run.k:
        ev["k"] = run.k
    elif run.samples is not None:
        ev["k"] = sorted({1, run.samples})
    for name in ("temperature", "max_tokens"):
        if getattr(run, name) is not None:
            ev.setdefault("sampling", {})[name] = getattr(run, name)
    if run.limit is not None:
        ev["limit"] = run.limit
    try:
        from gspo_rl.client.tasks import TaskConfig

        return TaskConfig.model_validate({**cfg.model_dump(), "eval": ev})
    except ValueError as exc:
        raise TaskConfigError(f"invalid eval settings: {exc}") from None


async def _evaluate(cfg: Any, env: Any, tasks: list[Any], url: str, api_key: str | None,
                    post: bool) -> Any:
    from gspo_rl.client.client import AsyncGSPOClient
    from gspo_rl.client.evals import evaluate

    ev = cfg.eval
    async with AsyncGSPOClient(url, api_key=api_key) as client:
        report = await evaluate(env, client, tasks, name=ev.name, samples=ev.samples, ks=ev.k,
                                sampling=ev.sampling.body(), concurrency=ev.concurrency)
        if post:
            await client.post_eval(ev.name, report.policy_version, report.metrics)
    return report


def run_eval(run: EvalRun) -> Any:
    """The evaluation's report (module docstring); ``TaskConfigError`` for bad settings."""
    if (run.model is None) == (run.url is None):
        raise TaskConfigError("give --model (a checkpoint) or --url (a running server)")
    cfg = eval_config(run)
    from gspo_rl.client.tasks import eval_environment

    try:  # the files are read (and checked) before anything starts
        env, tasks = eval_environment(cfg)
    except (OSError, ImportError, ValueError) as exc:
        raise TaskConfigError(str(exc)) from None
    if run.url is not None:
        return asyncio.run(_evaluate(cfg, env, tasks, run.url, os.environ.get("GSPO_API_KEY"),
                                     run.post))
    from gspo_rl.launch.processes import Processes, gspo_command, start_redis, wait_http

    model = resolve_model(str(run.model))
    with tempfile.TemporaryDirectory(prefix="gspo-eval-") as tmp:
        procs = Processes(Path(tmp))
        try:
            redis_url = start_redis(procs, Path(tmp))
            port, key = free_port(), secrets.token_urlsafe(16)
            procs.start("server", gspo_command(
                "serve", "--model", str(model), "--port", str(port), "--redis-url", redis_url,
                "--log-level", "warning", "--dtype", "float32",
                *(["--device", run.device] if run.device else [])),
                env={"GSPO_API_KEY": key, "GSPO_ADMIN_KEY": secrets.token_urlsafe(16)})
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/health", procs, "server", timeout_s=300)
            return asyncio.run(_evaluate(cfg, env, tasks, url, key, post=False))
        finally:
            procs.stop_all()
