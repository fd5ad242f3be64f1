"""reasoning-gym's procedural generators as a single-turn environment:
``reasoning-gym:NAME[:WEIGHT][,NAME[:WEIGHT]...]`` (docs/environments/reasoning-gym.md).

``load(target, args)`` checks every generator name and setting against the installed library
(a ``ValueError`` naming what exists) and returns a ``ReasoningGymEnvironment``. Each generator
is an endless stream: an epoch is ``size`` tasks of the dataset seeded ``seed + epoch * size``,
drawn without repetition in a seeded shuffled order; the generator of each task is drawn by
weight (a relative share of the tasks) from the environment's own seeded generator, so ``seed``
alone fixes the sequence of tasks. A task's id, ``"<generator>/<dataset seed>/<index>"``,
names its entry for good (given the same settings).

The prompt is chat messages: ``system_prompt`` (default: reasoning-gym's own answer-format
instruction) and the question. A completion is scored as reasoning-gym's eval scripts do: the
last ``<answer>...</answer>`` is extracted (none: no answer, ``None``) and the generator's own
``score_answer`` gives the reward, partial credit kept; a scorer that raises on a malformed
answer scores it 0.0 unless the task's own answer fails too (a broken task raises).
``score_entry`` is that scoring as a picklable function: with ``score_workers=N`` a group's
completions are scored in N worker processes, off the event loop (``scorer()``, ``tally``).
The library's registry, checks and datasets are ``reasoning_gym_library``'s; ``judge``
returns a ``Verdict`` (correct: reward >= 1).

``eval_tasks()``: ``eval_size`` tasks per generator from the dataset seeded ``eval_seed``
(default ``seed + 1_000_003``). Disjointness is kept on the training side: a training draw
whose question is one of the eval questions is skipped, in every epoch.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gspo_rl.client.adapters.reasoning_gym_library import (
    PREFIX,
    check_config,
    check_name,
    library,
    make_dataset,
    parse_target,
    registry,
    score_entry,
    scorer,
    suggest,
)
from gspo_rl.client.environment import SingleTurnEnvironment
from gspo_rl.client.selection import TaskSelection
from gspo_rl.client.tasks.environment import SourceStats
from gspo_rl.client.verifiers import Verdict

DEFAULT_SIZE = 10_000
DEFAULT_EVAL_SIZE = 50
EVAL_SEED_OFFSET = 1_000_003
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 1.0, "max_tokens": 1024}
SETTINGS = ("seed", "size", "group_size", "sampling", "system_prompt", "eval_size",
            "eval_seed", "selection", "score_workers", "score_timeout_s")
"""The adapter's own arguments; any other key names a generator of the spec (its config)."""


@dataclass(frozen=True)
class GymTask:
    """One generated task: its stable id, its generator (``source``), the question and the
    generator's entry (``question``, ``answer``, ``metadata``)."""

    id: str
    source: str
    question: str
    entry: dict[str, Any] = field(repr=False, compare=False)

    @property
    def answer(self) -> Any:
        """The reference answer (None for generators that check answers without one)."""
        return self.entry.get("answer")


@dataclass(frozen=True)
class Generator:
    """One generator of the spec: its name, its share of the tasks and its config."""

    name: str
    weight: float = 1.0
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Settings:
    """The adapter's own arguments, checked."""

    seed: int = 0
    size: int = DEFAULT_SIZE
    group_size: int = 8
    sampling: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_SAMPLING))
    system_prompt: str | None = "default"
    """The system message: text, or the name of one of reasoning-gym's prompts
    (``reasoning_gym.utils.SYSTEM_PROMPTS``: default, direct, simple, ...); None: none."""
    eval_size: int = DEFAULT_EVAL_SIZE
    eval_seed: int | None = None
    selection: dict[str, Any] = field(default_factory=dict)
    """``TaskSelection``'s settings (``selection.enabled=false`` turns it off)."""
    score_workers: int = 0
    """0: score on the event loop; N: in N worker processes (``scorer()``), off the loop."""
    score_timeout_s: float = 60.0
    """With ``score_workers``: a scoring call past this is killed and its group fails."""


def score_task(configs: Mapping[str, dict[str, Any]], task: GymTask, completion: str) -> float:
    """``score_entry`` of ``task`` with its generator's config from ``configs``."""
    return score_entry(task.source, configs[task.source], completion, task.entry)


def verdict(reward: float) -> Verdict:
    """A reward as a verdict: correct when it is 1.0 (what pass@k counts)."""
    return Verdict(reward=reward, correct=reward >= 1.0)


class _Stream:
    """One generator's endless draw: epochs of ``size`` tasks without repetition, each epoch
    its own dataset seed and shuffled order; questions in ``exclude`` are skipped."""

    def __init__(self, gen: Generator, seed: int, size: int) -> None:
        self.gen, self.seed, self.size = gen, seed, size
        self.epoch, self.position = -1, size
        self.order: list[int] = []
        self.dataset: Any = None

    def _next_epoch(self) -> None:
        self.epoch += 1
        self.dataset_seed = self.seed + self.epoch * self.size
        self.dataset = make_dataset(self.gen.name, self.gen.config, self.dataset_seed,
                                    self.size)
        self.order = list(range(self.size))
        random.Random(f"{self.seed}/{self.gen.name}/{self.epoch}").shuffle(self.order)
        self.position = 0

    def next(self, exclude: set[str]) -> GymTask:
        skipped = 0
        while True:
            if self.position >= self.size:
                if skipped >= self.size:
                    raise ValueError(f"{PREFIX}: every task {self.gen.name} drew in a whole "
                                     "epoch is an eval question: raise size or lower eval_size")
                self._next_epoch()
            index = self.order[self.position]
            self.position += 1
            task = make_task(self.gen.name, self.dataset, self.dataset_seed, index)
            if task.question not in exclude:
                return task
            skipped += 1


def make_task(name: str, dataset: Any, dataset_seed: int, index: int) -> GymTask:
    """Entry ``index`` of ``dataset`` (seeded ``dataset_seed``) as a task."""
    entry = dict(dataset[index])
    return GymTask(id=f"{name}/{dataset_seed}/{index}", source=name,
                   question=str(entry["question"]), entry=entry)


class ReasoningGymEnvironment(SingleTurnEnvironment):
    """reasoning-gym generators mixed by weight (module docstring). ``stats`` counts, per
    generator, the samples scored, their mean reward and how many were correct."""

    def __init__(self, generators: list[Generator], settings: Settings = Settings()) -> None:
        if not generators:
            raise ValueError(f"{PREFIX}: name at least one generator")
        self.generators = {g.name: g for g in generators}
        self.settings = settings
        self.group_size = settings.group_size
        self.sampling = dict(settings.sampling)
        self.score_workers, self.score_timeout_s = settings.score_workers, settings.score_timeout_s
        self.system_prompt = system_prompt_text(settings.system_prompt)
        self.eval_seed = (settings.eval_seed if settings.eval_seed is not None
                          else settings.seed + EVAL_SEED_OFFSET)
        self.stats = {g.name: SourceStats() for g in generators}
        self._streams = {g.name: _Stream(g, settings.seed, settings.size) for g in generators}
        self._rng = random.Random(f"{PREFIX}/{settings.seed}")
        self._eval: list[GymTask] | None = None
        self._eval_questions: dict[str, set[str]] = {}
        self.selection = TaskSelection(**settings.selection)  # by difficulty, on by default

    def sample_task(self, rng: random.Random) -> GymTask:
        """The next task (``rng`` unused: the environment's own seeded order)."""
        names = list(self.generators)
        name = self._rng.choices(names, [self.generators[n].weight for n in names])[0]
        held_out = self._held_out()[1]  # training draws skip the eval questions
        return self._streams[name].next(held_out[name])

    def eval_tasks(self) -> list[GymTask]:
        """``eval_size`` held-out tasks per generator."""
        return list(self._held_out()[0])

    def _held_out(self) -> tuple[list[GymTask], dict[str, set[str]]]:
        """The eval tasks and, per generator, their questions (made once, when first
        needed)."""
        if self._eval is None:
            tasks: list[GymTask] = []
            for g in self.generators.values():
                mine = self._eval_of(g)
                self._eval_questions[g.name] = {t.question for t in mine}
                tasks += mine
            self._eval = tasks
        return self._eval, self._eval_questions

    def _eval_of(self, gen: Generator) -> list[GymTask]:
        size = self.settings.eval_size
        if size == 0:
            return []
        dataset = make_dataset(gen.name, gen.config, self.eval_seed, size)
        return [make_task(gen.name, dataset, self.eval_seed, i) for i in range(size)]

    def prompt(self, task: GymTask) -> list[dict[str, Any]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": task.question}]

    def judge(self, task: GymTask, completion: str) -> Verdict:
        """The completion's reward and whether it is correct (reward >= 1), counted nowhere."""
        return verdict(score_entry(task.source, self.generators[task.source].config,
                                   completion, task.entry))

    def score(self, task: GymTask, completion: str) -> float:
        return self.tally(task, self.judge(task, completion).reward)

    def scorer(self) -> Callable[[GymTask, str], float]:
        """What scoring workers run (``score_workers``): ``score_entry`` with the generators'
        configs, without the environment."""
        return functools.partial(score_task, {n: g.config for n, g in self.generators.items()})

    def tally(self, task: GymTask, scored: float) -> float:
        """Counts a reward in ``stats`` (also one scored in a worker process)."""
        reward = float(scored)
        self.stats[task.source].add(verdict(reward))
        return reward

    def group_metadata(self, task: GymTask) -> dict[str, Any]:
        return {"source": task.source, "task_id": task.id}

    def summary(self) -> dict[str, dict[str, float]]:
        return {name: s.as_dict() for name, s in self.stats.items()}


def system_prompt_text(prompt: str | None) -> str | None:
    """``prompt``, or the text of reasoning-gym's prompt of that name."""
    library()
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if not prompt or prompt in ("null", "none"):  # --env-arg system_prompt=null: none
        return None
    text: str = SYSTEM_PROMPTS.get(prompt, prompt)  # (reasoning-gym ships no types)
    return text


def _int(args: Mapping[str, Any], key: str, default: int, least: int | None) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or (
            least is not None and value < least):
        bound = f" >= {least}" if least is not None else ""
        raise ValueError(f"{PREFIX}: {key} must be an integer{bound}, got {value!r}")
    return value


def settings_of(args: Mapping[str, Any]) -> Settings:
    """The adapter's own arguments (``SETTINGS``) from ``args``, checked."""
    sampling = args.get("sampling", {})
    if not isinstance(sampling, Mapping):
        raise ValueError(f"{PREFIX}: sampling must be a mapping (sampling.KEY=VALUE), "
                         f"got {sampling!r}")
    prompt = args.get("system_prompt", "default")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"{PREFIX}: system_prompt must be a string, got {prompt!r}")
    eval_seed = args.get("eval_seed")
    return Settings(
        seed=_int(args, "seed", 0, None), size=_int(args, "size", DEFAULT_SIZE, 1),
        group_size=_int(args, "group_size", 8, 1),
        sampling={**DEFAULT_SAMPLING, **sampling},
        system_prompt=prompt or None,
        eval_size=_int(args, "eval_size", DEFAULT_EVAL_SIZE, 0),
        eval_seed=None if eval_seed is None else _int(args, "eval_seed", 0, None),
        selection=_selection(args.get("selection", {})),
        score_workers=_int(args, "score_workers", 0, 0),
        score_timeout_s=_positive(args, "score_timeout_s", 60.0))


def _positive(args: Mapping[str, Any], key: str, default: float) -> float:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 < value < float("inf")):
        raise ValueError(f"{PREFIX}: {key} must be a number > 0, got {value!r}")
    return float(value)


def _selection(raw: Any) -> dict[str, Any]:
    """``selection.*`` arguments, checked by building a ``TaskSelection`` of them."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{PREFIX}: selection must be a mapping (selection.KEY=VALUE)")
    try:
        TaskSelection(**raw)
    except TypeError as exc:
        raise ValueError(f"{PREFIX}: selection: {exc}") from None
    return dict(raw)


def load(target: str, args: dict[str, Any]) -> ReasoningGymEnvironment:
    """The environment of ``reasoning-gym:TARGET`` with ``args`` (module docstring)."""
    library()
    weights = parse_target(target)
    names = [n for n, _ in weights]
    for name in names:
        check_name(name)
    for key in args:
        if key in registry() and key not in names:
            raise ValueError(f"{PREFIX}: settings for {key!r}, which the spec does not name "
                             f"(it names {', '.join(names)})")
        if key not in SETTINGS and key not in names:
            raise ValueError(f"{PREFIX}: unknown argument {key!r}"
                             f"{suggest(key, [*SETTINGS, *names])}: the arguments are "
                             f"{', '.join(SETTINGS)}, or a generator of the spec "
                             f"({', '.join(names)}) with its settings ({names[0]}.KEY=VALUE)")
    generators = []
    for name, weight in weights:
        config = args.get(name, {})
        check_config(name, config)
        scorer(name, json.dumps(config, sort_keys=True))  # the library checks the values
        generators.append(Generator(name, weight, dict(config)))
    return ReasoningGymEnvironment(generators, settings_of(args))
