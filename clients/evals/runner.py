"""Run an eval set against a server, unrecorded: every answer is sampled with
``"record": false`` (no group, no admission, nothing trained; served also after the learner's
target), judged like a training sample, and summarised as pass@k and mean reward.

Works with any environment: a single-turn one samples ``samples`` answers of each task in one
``POST /v1/rollouts`` and judges them with ``judge`` (tasks from data: ``Verdict``) or
``score`` (correct: reward >= ``threshold``); a multi-turn one plays ``samples`` episodes of
each task with unrecorded sessions (``EpisodeSession.record``), through ``play`` when it has
one (counted nowhere), else ``episode``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.environment import (
    EpisodeResult,
    EpisodeSession,
    MultiTurnEnvironment,
    SingleTurnEnvironment,
)
from gspo_rl.client.evals.passk import TaskResult, summarize


@dataclass
class EvalReport:
    """One evaluation: the metrics, the versions that answered, every task's answers."""

    name: str
    policy_version: int
    """The oldest version that sampled an answer (multi-turn: the server's at the start)."""
    newest_version: int
    metrics: dict[str, float]
    seconds: float
    sampling: dict[str, Any] = field(default_factory=dict)
    results: list[TaskResult] = field(default_factory=list)

    def line(self) -> str:
        """One line for a terminal."""
        passes = "  ".join(f"{k} {v:.3f}" for k, v in self.metrics.items()
                           if k.startswith("pass@"))
        versions = (f"v{self.policy_version}" if self.newest_version == self.policy_version
                    else f"v{self.policy_version}-{self.newest_version}")
        return (f"eval {self.name} {versions}: mean reward "
                f"{self.metrics.get('mean_reward', 0.0):.3f}  {passes}  "
                f"({self.metrics.get('tasks', 0):.0f} tasks, {self.seconds:.0f} s)")

    def to_dict(self, with_results: bool = True) -> dict[str, Any]:
        out = asdict(self)
        if not with_results:
            out.pop("results")
        return out

    def write(self, path: str | Path) -> Path:
        """The whole report (every task's answers included) as JSON."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1, default=str) + "\n")
        return p


def _verdict(env: Any, task: Any, text: str, threshold: float) -> tuple[float, bool]:
    judge = getattr(env, "judge", None)
    if judge is not None:
        v = judge(task, text)
        return v.reward, v.correct
    reward = float(env.score(task, text))
    return reward, reward >= threshold


def _task_fields(task: Any, index: int) -> tuple[str, str, Any]:
    return (str(getattr(task, "id", index)), str(getattr(task, "source", "all")),
            getattr(task, "answer", None))


async def _single(env: SingleTurnEnvironment, client: AsyncGSPOClient, task: Any, index: int,
                  samples: int, sampling: dict[str, Any], threshold: float,
                  versions: list[int]) -> TaskResult:
    p = env.prompt(task)
    kwargs: dict[str, Any] = {"prompt": p} if isinstance(p, str) else {"messages": p}
    group = await client.rollouts(n=samples, record=False, **kwargs, **sampling)
    versions += [r.policy_version for r in group.rollouts]
    texts = [r.text for r in group.rollouts]
    judged = [_verdict(env, task, t, threshold) for t in texts]
    task_id, source, answer = _task_fields(task, index)
    return TaskResult(task_id, source, [r for r, _ in judged], [c for _, c in judged], texts,
                      answer)


async def _multi(env: MultiTurnEnvironment, client: AsyncGSPOClient, task: Any, index: int,
                 samples: int, model: str, threshold: float) -> TaskResult:
    play = getattr(env, "play", env.episode)
    session = EpisodeSession(base_url=client.base_url, rollout_id=None, group_id=None,
                             model=model, api_key=client.api_key, record=False)
    outs = await asyncio.gather(*(play(task, session) for _ in range(samples)))
    results = [o if isinstance(o, EpisodeResult) else EpisodeResult(float(o)) for o in outs]
    task_id, source, answer = _task_fields(task, index)
    return TaskResult(task_id, source, [r.reward for r in results],
                      [r.correct if r.correct is not None else r.reward >= threshold
                       for r in results], [], answer)


async def evaluate(env: SingleTurnEnvironment | MultiTurnEnvironment, client: AsyncGSPOClient,
                   tasks: Sequence[Any], *, name: str = "eval", samples: int = 4,
                   ks: Sequence[int] = (1,), sampling: dict[str, Any] | None = None,
                   concurrency: int = 8, threshold: float = 1.0) -> EvalReport:
    """Every task answered ``samples`` times, unrecorded; the report (module docstring).
    ``sampling``: the eval's own settings (default: the environment's)."""
    if not tasks:
        raise ValueError("no eval task")
    ks = sorted({k for k in ks if 1 <= k <= samples}) or [1]
    started = time.monotonic()
    health = await client.health()
    sampling = dict(sampling if sampling is not None else getattr(env, "sampling", {}))
    gate = asyncio.Semaphore(concurrency)
    versions: list[int] = []

    async def one(i: int, task: Any) -> TaskResult:
        async with gate:
            if isinstance(env, SingleTurnEnvironment):
                return await _single(env, client, task, i, samples, sampling, threshold,
                                     versions)
            return await _multi(env, client, task, i, samples, str(health["model"]),
                                threshold)

    results = list(await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks))))
    if not versions:  # multi-turn: the versions the server held before and after
        versions = [int(health["policy_version"]),
                    int((await client.health())["policy_version"])]
    return EvalReport(name=name, policy_version=min(versions), newest_version=max(versions),
                      metrics=summarize(results, ks), seconds=time.monotonic() - started,
                      sampling=sampling, results=results)
