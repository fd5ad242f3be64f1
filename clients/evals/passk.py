"""pass@k and the summary of an evaluation: pure functions of per-task results.

pass@k is the unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models
Trained on Code"): with ``n`` answers to a task of which ``c`` are correct, the chance that at
least one of ``k`` answers drawn without replacement is correct, ``1 - C(n-c, k) / C(n, k)``,
averaged over tasks. It is exact (no sampling of subsets) and defined for ``k <= n``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that a k-subset of n answers, c of them correct, holds a correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class TaskResult:
    """One task's answers: their rewards, which were correct, their texts."""

    task_id: str
    source: str
    rewards: list[float]
    correct: list[bool]
    texts: list[str] = field(default_factory=list)
    answer: object = None


def summarize(results: Sequence[TaskResult], ks: Sequence[int]) -> dict[str, float]:
    """``mean_reward`` (over every answer), ``pass@k`` for each k (over tasks), ``tasks``,
    ``samples``; and per source (when there are several) ``<source>/mean_reward`` and
    ``<source>/pass@k``."""
    out = _summary(results, ks)
    sources = sorted({r.source for r in results})
    if len(sources) > 1:
        for s in sources:
            part = _summary([r for r in results if r.source == s], ks)
            out.update({f"{s}/{k}": v for k, v in part.items() if k != "samples"})
    return out


def _summary(results: Sequence[TaskResult], ks: Sequence[int]) -> dict[str, float]:
    rewards = [x for r in results for x in r.rewards]
    out = {"mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
           "tasks": float(len(results)), "samples": float(len(rewards))}
    for k in ks:
        scored = [pass_at_k(len(r.correct), sum(r.correct), k) for r in results
                  if len(r.correct) >= k]
        out[f"pass@{k}"] = sum(scored) / len(scored) if scored else 0.0
    return out
