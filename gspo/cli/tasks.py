"""What ``gspo env``, ``gspo up`` and ``gspo eval`` share about tasks from data: the task
configuration named on the command line (a TOML/YAML file, or ``--data`` files with a
``--verifier``), overridden by the flags, and the evaluation watcher it implies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TASK_SUFFIXES = (".toml", ".yaml", ".yml")


class TaskConfigError(ValueError):
    """The command line names no valid task configuration."""


def is_task_file(name: str | None) -> bool:
    return name is not None and name.lower().endswith(TASK_SUFFIXES)


def task_config(config: str | None, data: list[str] | None, verifier: str | None,
                eval_data: list[str] | None = None, eval_every: int | None = None,
                group_size: int | None = None) -> Any:
    """The ``TaskConfig`` of a file (``config``) or of ``--data`` files; None: neither.
    ``TaskConfigError`` (with pydantic's or the loader's reason) when they do not make one."""
    from pydantic import ValidationError

    from gspo_rl.client.tasks import SourceConfig, TaskConfig

    if config is None and not data:
        if eval_data or verifier:
            raise TaskConfigError("--verifier and --eval-data go with --data or a task file")
        return None
    try:
        if config is not None:
            cfg = TaskConfig.load(config)
            if data:
                cfg = cfg.model_copy(update={"sources": [SourceConfig(path=d) for d in data]})
            if verifier:
                cfg = cfg.model_copy(update={"verifier": {"kind": verifier}})
                cfg = TaskConfig.model_validate(cfg.model_dump())
        else:
            cfg = TaskConfig.from_options(list(data or []), verifier or "exact")
        if eval_data:
            ev = cfg.eval.model_dump() if cfg.eval is not None else {}
            ev["sources"] = [{"path": d} for d in eval_data]
            cfg = TaskConfig.model_validate({**cfg.model_dump(), "eval": ev})
        if eval_every is not None and cfg.eval is not None:
            cfg = TaskConfig.model_validate(
                {**cfg.model_dump(), "eval": {**cfg.eval.model_dump(), "every": eval_every}})
        if group_size is not None:
            cfg = cfg.model_copy(update={"group_size": group_size})
    except ValidationError as exc:
        lines = [f"  {'.'.join(map(str, e['loc'])) or 'tasks'}: {e['msg']}"
                 for e in exc.errors()]
        raise TaskConfigError("invalid task configuration:\n" + "\n".join(lines)) from None
    except (OSError, ImportError, ValueError) as exc:
        raise TaskConfigError(str(exc)) from None
    return cfg


def watcher_for(cfg: Any, out: Path | None, on_report: Any = None, post: bool = True) -> Any:
    """The ``EvalWatcher`` of ``cfg``'s eval set (None without one)."""
    if cfg is None or cfg.eval is None:
        return None
    from gspo_rl.client.evals import EvalWatcher
    from gspo_rl.client.tasks import eval_environment

    env, tasks = eval_environment(cfg)
    ev = cfg.eval
    return EvalWatcher(env, tasks, name=ev.name, every=ev.every, samples=ev.samples,
                       ks=ev.k, sampling=ev.sampling.body(), concurrency=ev.concurrency,
                       out=out, on_report=on_report, post=post)
