"""The order tasks are played in: epochs, shuffling with a seed, several sources mixed by
weight.

``TaskSource`` walks its tasks epoch after epoch (``epochs``: None, forever), each epoch in a
fresh order drawn from its seed (``shuffle``) or in file order. ``TaskMixture`` draws the
source of each next task by weight (seeded), among the sources that still have tasks; when
every source is used up it raises ``TasksExhausted`` (the run ends once the groups in flight
finish). Pure: no I/O; the same seed gives the same sequence.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from gspo_rl.client.environment import TasksExhausted
from gspo_rl.client.tasks.task import Task


class TaskSource:
    """One source's tasks, in epochs."""

    def __init__(self, name: str, tasks: Sequence[Task], *, weight: float = 1.0,
                 epochs: int | None = None, shuffle: bool = True, seed: int = 0) -> None:
        if not tasks:
            raise ValueError(f"source {name!r} has no tasks")
        if weight <= 0 or (epochs is not None and epochs < 1):
            raise ValueError(f"source {name!r}: weight must be > 0 and epochs >= 1")
        self.name, self.tasks, self.weight = name, list(tasks), weight
        self.epochs, self.shuffle = epochs, shuffle
        self.rng = random.Random(f"{seed}:{name}")
        self.epoch = 0
        self._order: Iterator[Task] = iter(())

    def next(self) -> Task | None:
        """The next task, or None once ``epochs`` epochs are done."""
        task = next(self._order, None)
        if task is not None:
            return task
        if self.epochs is not None and self.epoch >= self.epochs:
            return None
        self.epoch += 1
        order = list(self.tasks)
        if self.shuffle:
            self.rng.shuffle(order)
        self._order = iter(order)
        return next(self._order)


class TaskMixture:
    """Sources mixed by weight."""

    def __init__(self, sources: Sequence[TaskSource], seed: int = 0) -> None:
        if not sources:
            raise ValueError("no task source")
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must differ, got {names}")
        self.sources = list(sources)
        self.live = list(sources)
        self.rng = random.Random(f"{seed}:mixture")

    def next(self) -> Task:
        while self.live:
            source = self.live[0] if len(self.live) == 1 else self.rng.choices(
                self.live, weights=[s.weight for s in self.live])[0]
            task = source.next()
            if task is not None:
                return task
            self.live.remove(source)
        raise TasksExhausted("every task source is used up (epochs)")

    def __len__(self) -> int:
        return sum(len(s.tasks) for s in self.sources)
