"""What ``gspo up`` trains on: the alphabet demo; tasks from data (``--tasks`` a task file,
or ``--data`` files with a ``--verifier``); or environments (``--env SPEC[@WEIGHT]``, repeatable,
with ``--env-arg``: your class, ``verifiers:``, ``reasoning-gym:``, ``openenv:``,
``textarena:``; also
``--tasks reasoning-gym:NAME,...``), several side by side as a ``Mix``. Their eval sets (a task
file's, or an environment's ``eval_tasks()``) run every N policy versions beside the training
groups and once more after training (unrecorded: served also after the learner's target)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEMO_GROUP_SIZE = 8
EVAL_EVERY = 10  # versions between evaluations of an environment's eval set
EVAL_SAMPLES = 4


@dataclass
class Workload:
    env: Any
    title: str
    watcher: Any = None  # gspo_rl.client.evals.EvalWatcher (or Watchers), or None
    seed: int = 0  # of the environment's task draws
    reports: list[Any] = field(default_factory=list)

    def on_report(self, report: Any) -> None:
        self.reports.append(report)

    def without_selection(self) -> None:
        """Task selection by difficulty off for every environment of the workload."""
        for env in [m.env for m in getattr(self.env, "members", [])] or [self.env]:
            if getattr(env, "selection", None) is not None:
                env.selection.enabled = False

    def status(self) -> str:
        """The latest evaluation, briefly (for the progress bar)."""
        if not self.reports:
            return ""
        r = self.reports[-1]
        passes = [v for k, v in r.metrics.items() if k.startswith("pass@")]
        return f"  eval v{r.policy_version} {passes[0] if passes else 0.0:.2f}"

    def summary(self) -> list[str]:
        """Per-source rewards and every evaluation, one line each."""
        envs = [m.env for m in getattr(self.env, "members", [])] or [self.env]
        lines = [f"source {name}: {s['samples']:.0f} samples, reward {s['reward_mean']:.3f}, "
                 f"correct {s['accuracy']:.3f}"
                 for env in envs for name, s in getattr(env, "summary", dict)().items()]
        lines += [env.selection.summary() for env in envs
                  if getattr(env, "selection", None) is not None and env.selection.enabled]
        return lines + [r.line() for r in self.reports]


def make_workload(tasks: str | None, data: list[str], verifier: str | None,
                  eval_every: int | None, group_size: int | None, run_dir: Path,
                  envs: list[str] | None = None, env_args: list[str] | None = None
                  ) -> Workload:
    """The environment (and eval watcher) of a ``gspo up`` run; ``TaskConfigError`` for a bad
    task configuration (its files included) or an environment that cannot be loaded."""
    from gspo_rl.cli.tasks import TaskConfigError, task_config, watcher_for

    specs = list(envs or [])
    if tasks is not None and tasks.startswith("reasoning-gym:"):
        specs, tasks = [tasks, *specs], None
    if specs:
        if tasks is not None or data:
            raise TaskConfigError("--env goes alone: not with --tasks or --data (a task file "
                                  "of its own is one environment among --env's)")
        try:
            return environments_workload(specs, env_args or [], group_size, eval_every,
                                         run_dir / "evals.jsonl")
        except (OSError, ImportError, ValueError) as exc:
            raise TaskConfigError(str(exc)) from None
    if env_args:
        raise TaskConfigError("--env-arg goes with --env")
    cfg = task_config(tasks, data, verifier, None, eval_every, group_size)
    if cfg is None:
        from gspo_rl.client.examples.alphabet import AlphabetEnvironment

        return Workload(AlphabetEnvironment(group_size=group_size or DEMO_GROUP_SIZE),
                        "the alphabet task")
    from gspo_rl.client.tasks import build_environment

    try:
        work = Workload(build_environment(cfg), f"{cfg.name} (tasks from data)")
        work.watcher = watcher_for(cfg, run_dir / "evals.jsonl", on_report=work.on_report)
    except (OSError, ImportError, ValueError) as exc:
        raise TaskConfigError(str(exc)) from None
    return work


def environments_workload(specs: list[str], env_args: list[str], group_size: int | None,
                          eval_every: int | None, eval_out: Path | None) -> Workload:
    """``--env`` specs (``gspo_rl.client.loading``): one environment, or a ``Mix`` of them,
    with a watcher over every eval set they have (``eval_tasks()``)."""
    from gspo_rl.client.evals import EvalWatcher
    from gspo_rl.client.evals.watcher import Watchers
    from gspo_rl.client.loading import load_environment, parse_spec, with_args
    from gspo_rl.client.mixture import Member, Mix

    parsed = with_args([parse_spec(s) for s in specs], env_args)
    members = [Member(s.name, load_environment(s.spec, group_size, s.args), s.weight)
               for s in parsed]
    env = members[0].env if len(members) == 1 else Mix(members)
    work = Workload(env, " + ".join(s.spec for s in parsed))
    watchers = [EvalWatcher(m.env, tasks, name=eval_name(m.name),
                            every=eval_every or getattr(m.env, "eval_every", None) or EVAL_EVERY,
                            samples=getattr(m.env, "eval_samples", None) or EVAL_SAMPLES,
                            out=eval_out, on_report=work.on_report)
                for m in members
                if callable(getattr(m.env, "eval_tasks", None)) and (tasks := m.env.eval_tasks())]
    if watchers:
        work.watcher = watchers[0] if len(watchers) == 1 else Watchers(watchers)
    return work


def eval_name(name: str) -> str:
    """An environment's name as an eval set's (letters, digits and ``_.-/@``, 64 at most:
    ``POST /v1/evals``): ``leg_counting+basic_arithmetic`` -> ``leg_counting_basic_arithmetic``."""
    return re.sub(r"[^A-Za-z0-9_.\-@]", "_", name)[:64] or "eval"
