"""Evaluation: an eval set answered unrecorded (``"record": false``), summarised as pass@k and
mean reward; once (``evaluate``, ``gspo eval``) or every N policy versions during training
(``EvalWatcher``, ``gspo env --eval-every``). Reference: docs/evaluation.md."""

from gspo_rl.client.evals.passk import TaskResult, pass_at_k, summarize
from gspo_rl.client.evals.runner import EvalReport, evaluate
from gspo_rl.client.evals.watcher import EvalWatcher

__all__ = ["EvalReport", "EvalWatcher", "TaskResult", "evaluate", "pass_at_k", "summarize"]
