"""Task selection by difficulty: sample less of what every sample solves, or fails.

A group whose samples all earn the same reward teaches the learner nothing (every advantage
is 0; the server drops it) and costs as much to sample as any other. A task's band comes from
its statistics, which every server keeps in Redis as its groups end and every environment
process reads (``POST /v1/tasks/stats``; they survive restarts):

- ``new``: no group of the task has ended yet;
- ``solved``: its last ``streak`` groups (or more) had every sample at ``solved_reward`` or
  above; ``failed``: at ``failed_reward`` or below; ``flat``: all equal in between;
- ``learnable``: anything else (its last group had a learning signal).

``TaskSelection.draw`` draws a task from the environment; one in a band without signal
(solved, failed, flat) is passed over with probability ``1 - revisit`` and another drawn, up
to ``max_draws`` draws (then the last is kept: a run never stalls on selection). Each task is
still revisited now and then, so one that becomes learnable (the policy improved, or
forgot) comes back. The draws of a batch are looked up in one request, cached ``cache_s``.
A task's id is its group metadata's ``task_id`` (tasks from data, reasoning-gym, verifiers,
OpenEnv set it; a class environment sets ``selection`` and returns ``task_id`` from
``group_metadata``). With a finite source (epochs), a passed-over task is not put back: the
epoch ends sooner. Counts by band (drawn, passed over) are in ``counts``.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gspo_rl.client.errors import GSPOError

log = logging.getLogger(__name__)
NO_SIGNAL_BANDS = ("solved", "failed", "flat")
BAND_KEY = "difficulty"
"""The group metadata key that carries the band a task was drawn in (the learner reports
``difficulty/<band>/...``)."""


def band_of(stats: dict[str, float] | None, streak: int = 1, solved_reward: float = 1.0,
            failed_reward: float = 0.0) -> str:
    """The band of a task's statistics (module docstring). Pure."""
    if not stats or stats.get("groups", 0) <= 0:
        return "new"
    if stats.get("streak", 0) < streak:
        return "learnable"
    value = stats.get("streak_value", 0.0)
    if value >= solved_reward:
        return "solved"
    return "failed" if value <= failed_reward else "flat"


@dataclass
class TaskSelection:
    """The selection policy and its counts (module docstring)."""

    enabled: bool = True
    streak: int = 1
    """Groups in a row without signal that put a task in a no-signal band."""
    solved_reward: float = 1.0
    failed_reward: float = 0.0
    revisit: float = 0.1
    """The chance a task in a no-signal band is played when drawn."""
    max_draws: int = 8
    cache_s: float = 10.0
    counts: Counter[str] = field(default_factory=Counter)
    _cache: dict[str, tuple[float, dict[str, float] | None]] = field(default_factory=dict)
    _warned: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.revisit <= 1.0 or self.max_draws < 1 or self.streak < 1:
            raise ValueError("revisit must be in [0, 1], max_draws and streak >= 1")

    def band(self, stats: dict[str, float] | None) -> str:
        return band_of(stats, self.streak, self.solved_reward, self.failed_reward)

    async def draw(self, env: Any, rng: random.Random, client: Any) -> tuple[Any, str]:
        """A task of ``env`` and its band (``sample_task``'s errors, ``TasksExhausted``
        included, propagate)."""
        tasks = [env.sample_task(rng)]
        ids = [task_id_of(env, tasks[0])]
        stats = await self._lookup(client, ids)
        for i in range(self.max_draws):
            band = self.band(stats.get(ids[-1])) if ids[-1] is not None else "new"
            if band not in NO_SIGNAL_BANDS or rng.random() < self.revisit \
                    or i == self.max_draws - 1:
                self.counts[f"drawn_{band}"] += 1
                return tasks[-1], band
            self.counts[f"passed_over_{band}"] += 1
            tasks.append(env.sample_task(rng))
            ids.append(task_id_of(env, tasks[-1]))
            if ids[-1] is not None and ids[-1] not in stats:
                stats.update(await self._lookup(client, ids[-1:]))
        raise AssertionError("unreachable")

    async def _lookup(self, client: Any, ids: list[str | None]
                      ) -> dict[str, dict[str, float] | None]:
        """The statistics of ``ids`` (cached ``cache_s``); a failed lookup is logged once and
        treated as no statistics (the run goes on, unselected)."""
        now = time.monotonic()
        want = [i for i in ids if i is not None and
                (i not in self._cache or now - self._cache[i][0] > self.cache_s)]
        if want:
            try:
                fresh = await client.task_stats(want)
            except (GSPOError, OSError) as exc:
                if not self._warned:
                    self._warned = True
                    log.warning("task selection: statistics unavailable (%s): drawing "
                                "without them", exc)
                fresh = {}
            for i in want:
                self._cache[i] = (now, fresh.get(i))
        return {i: self._cache[i][1] for i in ids if i is not None}

    def summary(self) -> str:
        """One line: the tasks drawn and passed over, by band."""
        drawn = {k.removeprefix("drawn_"): v for k, v in self.counts.items()
                 if k.startswith("drawn_")}
        skipped = {k.removeprefix("passed_over_"): v for k, v in self.counts.items()
                   if k.startswith("passed_over_")}
        return (f"task selection: drawn {dict(sorted(drawn.items()))}, passed over "
                f"{dict(sorted(skipped.items()))}")


def task_id_of(env: Any, task: Any) -> str | None:
    """The task's id: its group metadata's ``task_id`` (None: the environment names none)."""
    meta = env.group_metadata(task) or {}
    tid = meta.get("task_id") if isinstance(meta, dict) else None
    return str(tid) if tid not in (None, "") else None
