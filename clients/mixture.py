"""Several environments side by side, and what a run holds open around its environments.

``Mix([Member("math", env_a, 2.0), Member("game", env_b)])`` is taken by ``arun_groups``
wherever one environment is: each group is drawn from one member, chosen at random by weight
(its share of the groups; the run's seed fixes the draws), and its metadata carries
``{"env": name}`` so the learner reports each environment apart (``env/<name>/...``). A member
whose finite tasks run out (``TasksExhausted``) leaves the mix; the run ends when none is left.

``serving(env)`` is the context a run holds around an environment: an adapter that shares
something between its groups (a tool server, worker processes, a connection pool) defines an
async context manager ``serving()`` on it, re-entrant (the run and its evaluation may both
enter it); other environments need nothing.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

ENV_KEY = "env"
"""The group metadata key that names the member a group came from."""


@dataclass
class Member:
    name: str
    env: Any
    weight: float = 1.0


class Mix:
    """Environments drawn by weight (module docstring)."""

    def __init__(self, members: Sequence[Member]) -> None:
        if not members:
            raise ValueError("a mix needs at least one environment")
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ValueError(f"environment names must differ, got {names}: name them apart")
        bad = [f"{m.name}@{m.weight}" for m in members
               if not (m.weight > 0 and math.isfinite(m.weight))]
        if bad:
            raise ValueError(f"every environment's weight must be a finite number > 0, got "
                             f"{', '.join(bad)}")
        self.members = list(members)
        self.live = list(members)

    def pick(self, rng: random.Random) -> Member:
        """A member still playing, by weight. IndexError when none is left."""
        if not self.live:
            raise IndexError("every environment of the mix ran out of tasks")
        if len(self.live) == 1:  # no draw: one environment's task order is the seed's alone
            return self.live[0]
        return rng.choices(self.live, weights=[m.weight for m in self.live])[0]

    def retire(self, member: Member) -> None:
        """``member`` ran out of tasks."""
        if member in self.live:
            self.live.remove(member)

    def get(self, name: str) -> Member:
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(name)


def members_of(env: Any) -> list[Member]:
    """The members of a mix, or one nameless member for a single environment."""
    return list(env.members) if isinstance(env, Mix) else [Member("", env)]


def serving(env: Any) -> contextlib.AbstractAsyncContextManager[Any]:
    """``env.serving()`` when the environment defines one, else nothing (module docstring)."""
    hook = getattr(env, "serving", None)
    return hook() if callable(hook) else contextlib.nullcontext()


@contextlib.asynccontextmanager
async def serving_all(env: Any) -> AsyncIterator[None]:
    """Every member's ``serving`` context, entered in order and left in reverse."""
    async with contextlib.AsyncExitStack() as stack:
        for m in members_of(env):
            await stack.enter_async_context(serving(m.env))
        yield
