"""The built-in environments over tasks from data.

``DataEnvironment`` (single-turn): each task's prompt, ``group_size`` samples, each judged by
the verifier against the task's answer. ``RetryEnvironment`` (multi-turn): each episode answers,
and a wrong answer gets ``feedback`` as a new user turn and another attempt, up to
``max_attempts``; a right answer at attempt i earns ``discount ** i`` (turn rewards: none, the
credit is the episode's). Both put the task's source and id in the group's metadata (the learner
reports rewards per source) and count, per source, the samples judged, their mean reward and
how many were correct (``stats``). ``build_environment(config)`` makes the one a
``TaskConfig`` describes; ``eval_environment(config)`` the one its eval set runs in.

``DataEnvironment`` judges in worker processes (``score_workers``; its verifier alone is sent
to them, the counting stays here) by default for the ``math`` and ``python`` verifiers:
math-verify takes tens of ms a call on a model's free text (a group of 8: up to a second),
which on the event loop holds every other group; a user's function may take anything. The
cheap ones (exact, numeric, regex, ...) cost about what a trip to a worker does (0.1 ms) and
judge in place. Measured: ``benchmarks/bench_scoring.py --math``.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from gspo_rl.client.environment import (
    EpisodeResult,
    EpisodeSession,
    MultiTurnEnvironment,
    SingleTurnEnvironment,
)
from gspo_rl.client.scoring import PICKLE_ERRORS, pickled
from gspo_rl.client.selection import TaskSelection
from gspo_rl.client.tasks.config import MultiTurnConfig, SourceConfig, TaskConfig
from gspo_rl.client.tasks.records import read_records
from gspo_rl.client.tasks.sampler import TaskMixture, TaskSource
from gspo_rl.client.tasks.task import Fields, Task, make_tasks
from gspo_rl.client.verifiers import Verdict, Verifier, make_verifier

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

log = logging.getLogger("gspo_rl.client.tasks")

SCORE_WORKERS = {"math": 2, "python": 2}
"""``DataEnvironment``'s default ``score_workers`` by verifier kind (others: 0, in place)."""


@dataclass
class SourceStats:
    """What one source's samples scored so far."""

    samples: int = 0
    reward_sum: float = 0.0
    correct: int = 0

    def add(self, verdict: Verdict) -> None:
        self.samples += 1
        self.reward_sum += verdict.reward
        self.correct += int(verdict.correct)

    def as_dict(self) -> dict[str, float]:
        n = max(1, self.samples)
        return {"samples": self.samples, "reward_mean": self.reward_sum / n,
                "accuracy": self.correct / n}


class _Judged:
    """What both environments share: the tasks, the verifier, the per-source counts."""

    mixture: TaskMixture
    verifier: Verifier
    stats: dict[str, SourceStats]

    def _setup(self, mixture: TaskMixture, verifier: Verifier,
               selection: TaskSelection | None = None) -> None:
        self.mixture, self.verifier = mixture, verifier
        self.stats = {s.name: SourceStats() for s in mixture.sources}
        self.selection = selection if selection is not None else TaskSelection()

    def sample_task(self, rng: random.Random) -> Task:
        return self.mixture.next()  # its own seeded order: epochs, shuffling, weights

    def judge(self, task: Task, completion: str) -> Verdict:
        return judge_with(self.verifier, task, completion)

    def group_metadata(self, task: Task) -> dict[str, Any]:
        return {"source": task.source, "task_id": task.id}

    def summary(self) -> dict[str, dict[str, float]]:
        return {name: s.as_dict() for name, s in self.stats.items()}


def judge_with(verifier: Verifier, task: Task, completion: str) -> Verdict:
    """What a scoring worker runs: the verdict on one completion (pure)."""
    return verifier(completion, task.answer, task.record)


def default_score_workers(verifier: Verifier) -> int:
    """``SCORE_WORKERS`` by the verifier's kind; 0 for a verifier that does not pickle (a
    ``python`` verifier given a lambda, say: it judges in place)."""
    workers = SCORE_WORKERS.get(verifier.kind, 0)
    if workers:
        try:
            pickled(verifier)
        except PICKLE_ERRORS as exc:
            log.warning("the %s verifier judges on the event loop: it cannot be sent to "
                        "worker processes (%s)", verifier.kind, exc)
            return 0
    return workers


class DataEnvironment(_Judged, SingleTurnEnvironment):
    def __init__(self, mixture: TaskMixture, verifier: Verifier, *, group_size: int = 8,
                 sampling: dict[str, Any] | None = None, text_prompts: bool = False,
                 score_workers: int | None = None) -> None:
        """``score_workers``: None: ``default_score_workers(verifier)``."""
        self._setup(mixture, verifier)
        self.group_size = group_size
        self.sampling = dict(sampling or {"temperature": 1.0, "max_tokens": 64})
        self.text_prompts = text_prompts
        self.score_workers = (default_score_workers(verifier) if score_workers is None
                              else score_workers)

    def prompt(self, task: Task) -> str | list[dict[str, Any]]:
        if not self.text_prompts:
            return task.chat()
        if task.prompt is None:
            raise ValueError(f"task {task.id} has chat messages: prompt_format text needs a "
                             "text prompt")
        return task.prompt

    def score(self, task: Task, completion: str) -> float:
        return self.tally(task, self.judge(task, completion))

    def scorer(self) -> Callable[[Task, str], Verdict]:
        return functools.partial(judge_with, self.verifier)  # the tasks stay here

    def tally(self, task: Task, scored: Verdict) -> float:
        self.stats[task.source].add(scored)
        return scored.reward


class RetryEnvironment(_Judged, MultiTurnEnvironment):
    def __init__(self, mixture: TaskMixture, verifier: Verifier, retry: MultiTurnConfig, *,
                 group_size: int = 4, sampling: dict[str, Any] | None = None,
                 timeout_s: float = 120.0) -> None:
        self._setup(mixture, verifier)
        self.retry, self.group_size, self.timeout_s = retry, group_size, timeout_s
        self.sampling = dict(sampling or {"temperature": 1.0, "max_tokens": 64})

    async def episode(self, task: Task, session: EpisodeSession) -> EpisodeResult:
        result = await self.play(task, session)
        self.stats[task.source].add(Verdict(result.reward, bool(result.correct)))
        return result

    async def play(self, task: Task, session: EpisodeSession) -> EpisodeResult:
        """One episode, counted nowhere (an evaluation plays it unrecorded)."""
        from openai import AsyncOpenAI

        messages = task.chat()
        verdict = Verdict(0.0, False)
        async with AsyncOpenAI(base_url=session.openai_base_url, timeout=self.timeout_s,
                               api_key=session.api_key or "unused", max_retries=2) as client:
            options = {k: v for k, v in self.sampling.items() if k != "top_k"}
            extra = {**session.extra_body, **({"top_k": self.sampling["top_k"]}
                                               if "top_k" in self.sampling else {})}
            for attempt in range(self.retry.max_attempts):
                response = await client.chat.completions.create(  # (messages: plain dicts)
                    model=session.model,
                    messages=cast("list[ChatCompletionMessageParam]", messages),
                    extra_body=extra, **options)
                content = response.choices[0].message.content or ""
                verdict = self.judge(task, content)
                if verdict.correct:
                    return EpisodeResult(reward=verdict.reward * self.retry.discount ** attempt,
                                         correct=True)
                messages += [{"role": "assistant", "content": content},
                             {"role": "user", "content": self.retry.feedback}]
        return EpisodeResult(reward=verdict.reward, correct=False)


def load_source(source: SourceConfig, defaults: TaskConfig) -> TaskSource:
    """One source's tasks, with the configuration's defaults."""
    from pathlib import Path

    name = source.name or Path(source.path).stem
    records = read_records(source.path, source.split)[:source.limit]
    fields = Fields(prompt=source.prompt_field, answer=source.answer_field, id=source.id_field,
                    template=source.template, system_prompt=defaults.system_prompt)
    return TaskSource(name, make_tasks(records, name, fields), weight=source.weight,
                      epochs=source.epochs or defaults.epochs, shuffle=defaults.shuffle,
                      seed=defaults.seed)


def build_environment(cfg: TaskConfig) -> DataEnvironment | RetryEnvironment:
    """The training environment ``cfg`` describes."""
    mixture = TaskMixture([load_source(s, cfg) for s in cfg.sources], seed=cfg.seed)
    verifier = make_verifier(cfg.verifier.kind, **cfg.verifier.options())
    env: DataEnvironment | RetryEnvironment
    if cfg.multi_turn is not None:
        env = RetryEnvironment(mixture, verifier, cfg.multi_turn, group_size=cfg.group_size,
                               sampling=cfg.sampling.body())
    else:
        env = DataEnvironment(mixture, verifier, group_size=cfg.group_size,
                              sampling=cfg.sampling.body(),
                              text_prompts=cfg.prompt_format == "text")
    env.selection = TaskSelection(**cfg.selection.model_dump())
    return env


def eval_environment(cfg: TaskConfig) -> tuple[DataEnvironment | RetryEnvironment, list[Task]]:
    """The environment ``cfg``'s eval set runs in (its sampling, one pass in file order)
    and the eval tasks."""
    if cfg.eval is None:
        raise ValueError("this task configuration has no eval set ([eval])")
    ev = cfg.eval
    once = cfg.model_copy(update={"epochs": 1, "shuffle": False, "sampling": ev.sampling,
                                  "sources": ev.sources, "eval": None})
    env = build_environment(once)
    tasks = [t for s in env.mixture.sources for t in s.tasks][:ev.limit]
    return env, tasks
