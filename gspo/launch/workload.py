"""What ``gspo up`` trains on: the alphabet demo, or tasks from data (``--tasks`` a task file,
or ``--data`` files with a ``--verifier``) with their eval set, run every N policy versions
beside the training groups and once more after training (unrecorded: served also after the
learner's target)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEMO_GROUP_SIZE = 8


@dataclass
class Workload:
    env: Any
    title: str
    watcher: Any = None  # gspo_rl.client.evals.EvalWatcher, or None
    reports: list[Any] = field(default_factory=list)

    def on_report(self, report: Any) -> None:
        self.reports.append(report)

    def status(self) -> str:
        """The latest evaluation, briefly (for the progress bar)."""
        if not self.reports:
            return ""
        r = self.reports[-1]
        passes = [v for k, v in r.metrics.items() if k.startswith("pass@")]
        return f"  eval v{r.policy_version} {passes[0] if passes else 0.0:.2f}"

    def summary(self) -> list[str]:
        """Per-source rewards and every evaluation, one line each."""
        lines = [f"source {name}: {s['samples']:.0f} samples, reward {s['reward_mean']:.3f}, "
                 f"correct {s['accuracy']:.3f}"
                 for name, s in getattr(self.env, "summary", dict)().items()]
        return lines + [r.line() for r in self.reports]


def make_workload(tasks: str | None, data: list[str], verifier: str | None,
                  eval_every: int | None, group_size: int | None, run_dir: Path) -> Workload:
    """The environment (and eval watcher) of a ``gspo up`` run; ``TaskConfigError`` for a bad
    task configuration (its files included)."""
    from gspo_rl.cli.tasks import TaskConfigError, task_config, watcher_for

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
