"""A verifiers 0.4 environment (``verifiers.v1``), unmodified, as a gspo ``MultiTurnEnvironment``.

A group is ``group_size`` verifiers episodes of one task; each episode is one rollout of the
group, played by verifiers itself (its ``Env``, harness program, tools and rubric) with our
rollout server as the model: every model call of the trainable agent carries the rollout's
id (``hooks.EpisodeRelay``), so the server records each turn token-exact with its own chat
template. The episode's reward is that agent's trace reward (the weighted sum of its
``@vf.reward`` functions and judges); a failed episode (an error in the harness, a tool, the
rubric) raises, so its group fails and the run's failure policy retries or abandons it: an
error never becomes a reward.

Settings differ from verifiers' own defaults in one place: an agent seat with no runtime set
runs in the local subprocess runtime (verifiers' default is a Prime sandbox, which needs an
account), so only the ``null`` harness may run there unasked (``seats.check_seats``: a shell
or coding harness needs its runtime set, ``agent.runtime.type``: docker, podman, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from gspo_rl.client.adapters.verifiers import hooks
from gspo_rl.client.adapters.verifiers.seats import check_seats
from gspo_rl.client.environment import EpisodeResult, EpisodeSession, MultiTurnEnvironment

if TYPE_CHECKING:
    from pydantic import BaseModel

MAX_TASKS = 100_000
"""Tasks read from a finite taskset (its first ones); an infinite one is read as it goes."""


class EpisodeFailed(RuntimeError):
    """A verifiers episode ended in error (its harness, tools, rubric or timeout)."""


def _agent_fields(config_cls: type[BaseModel]) -> list[str]:
    from verifiers.v1.configs.agent import AgentConfig

    return [name for name, f in config_cls.model_fields.items()
            if isinstance(f.default, AgentConfig)]


def env_config(taskset_id: str, config: dict[str, Any], harness: str | None = None) -> Any:
    """The verifiers ``EnvConfig`` for a taskset and ``config`` (``EnvConfig`` fields), with
    every agent seat in the local subprocess runtime unless it names one, and playing
    ``harness`` (a harness id) unless it names one."""
    from verifiers.v1.utils.loaders import env_config_type, resolve_env_config

    raw = dict(config)
    raw["taskset"] = {**raw.get("taskset", {}), "id": taskset_id}
    for seat in _agent_fields(env_config_type(taskset_id, str(raw.get("id") or ""))):
        agent = dict(raw.get(seat) or {})
        agent.setdefault("runtime", {"type": "subprocess"})
        if harness is not None:
            agent.setdefault("harness", {"id": harness})
        raw[seat] = agent
    return resolve_env_config(raw)


class TaskStream:
    """The training tasks of a taskset in a seeded order, epoch after epoch, and the first
    ``hold_out`` tasks kept apart for evaluation (never trained on)."""

    def __init__(self, taskset: Any, seed: int, hold_out: int = 0) -> None:
        self.rng = random.Random(seed)
        self.infinite = not taskset.bounded
        source = iter(taskset)
        self.held_out = list(itertools.islice(source, hold_out))
        if self.infinite:
            self.stream, self.tasks = source, []
        else:
            self.tasks = list(itertools.islice(source, MAX_TASKS))
            if not self.tasks:
                raise ValueError("the taskset has no task left to train on "
                                 f"(after holding out {hold_out} for evaluation)")
        self.order: list[Any] = []

    def next(self) -> Any:
        if self.infinite:
            return next(self.stream)
        if not self.order:
            self.order = list(self.tasks)
            self.rng.shuffle(self.order)
        return self.order.pop()


def task_id(task: Any) -> str:
    """A stable id: the task's own, else its content hash."""
    return str(task.data.id) if task.data.id is not None else str(task.key)[:16]


class VerifiersEnvironment(MultiTurnEnvironment):
    """A verifiers taskset played by its verifiers ``Env`` (module docstring)."""

    def __init__(self, taskset_id: str, config: dict[str, Any] | None = None, *,
                 group_size: int = 8, sampling: dict[str, Any] | None = None, seed: int = 0,
                 hold_out: int = 0, eval_taskset: dict[str, Any] | None = None,
                 eval_limit: int = 50, eval_every: int | None = None,
                 eval_samples: int | None = None, runtime_python: str = "prefork",
                 harness: str | None = None) -> None:
        hooks.install(runtime_python)
        from verifiers.v1.types import Sampling
        from verifiers.v1.utils.loaders import load_environment, load_taskset

        self.name, self.group_size = taskset_id, group_size
        self.config = env_config(taskset_id, config or {}, harness)
        self.env = load_environment(self.config)
        check_seats(self.env, self.config, _agent_fields(type(self.config)), config or {},
                    taskset_id)
        self.sampling = Sampling(**{"temperature": 1.0, **(sampling or {})})
        self.stream = TaskStream(self.env.taskset, seed, hold_out)
        self.eval_set = self.stream.held_out
        self.eval_every, self.eval_samples = eval_every, eval_samples
        if eval_taskset is not None:
            cfg = self.config.taskset.model_copy(update=eval_taskset)
            ts = load_taskset(type(self.config.taskset).model_validate(cfg.model_dump()))
            self.eval_set = list(itertools.islice(iter(ts), eval_limit))
        self._users, self._done = 0, asyncio.Event()
        self._holder: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._guard = asyncio.Lock()

    def sample_task(self, rng: random.Random) -> Any:
        return self.stream.next()

    def group_metadata(self, task: Any) -> dict[str, Any]:
        return {"source": self.name, "task_id": task_id(task)}

    def eval_tasks(self) -> list[Any]:
        """The held-out tasks (``hold_out``) or the eval taskset's (``eval_taskset``)."""
        return list(self.eval_set)

    async def episode(self, task: Any, session: EpisodeSession) -> EpisodeResult:
        return await self.play(task, session)

    async def play(self, task: Any, session: EpisodeSession) -> EpisodeResult:
        """One verifiers episode against the server, recorded as ``session``'s rollout (an
        unrecorded session: an evaluation's)."""
        from verifiers.v1.clients import ModelContext

        ctx = ModelContext(model=session.model, client=hooks.relay_config(
            session.openai_base_url), sampling=self.sampling)
        bound: list[tuple[str, bool]] = []

        def on_trace(trace: Any) -> None:
            trainable = trace.agent is None or bool(trace.agent.trainable)
            first = trainable and not any(b for _, b in bound)
            bound.append((trace.id, first))
            hooks.bind(trace.id, session.rollout_id if first and session.record else None,
                       session.api_key)

        try:
            async with self.serving():
                episode = await self.env.run_episode(task, ctx, on_trace=on_trace)
        finally:
            for trace_id, _ in bound:
                hooks.unbind(trace_id)
        return result(episode, {t for t, b in bound if b})

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """verifiers' serving resources (its interception server, shared tool servers),
        held by one background task while anything uses them (re-entrant, concurrent)."""
        await self._acquire()
        try:
            yield
        finally:
            await self._release()

    def _lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (a second asyncio.run)
            self._loop, self._guard, self._users = loop, asyncio.Lock(), 0
        return self._guard

    async def _acquire(self) -> None:
        async with self._lock():
            self._users += 1
            if self._users > 1:
                return
            ready, self._done = asyncio.Event(), asyncio.Event()
            self._holder = asyncio.create_task(self._hold(ready, self._done))
            waiter = asyncio.ensure_future(ready.wait())
            await asyncio.wait({self._holder, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if self._holder.done():  # start-up failed: raise it here
                self._users -= 1
                self._holder.result()

    async def _release(self) -> None:
        async with self._lock():
            self._users -= 1
            if self._users == 0 and self._holder is not None:
                self._done.set()
                with contextlib.suppress(Exception):
                    await self._holder
                self._holder = None

    async def _hold(self, ready: asyncio.Event, done: asyncio.Event) -> None:
        async with self.env.serving():
            ready.set()
            await done.wait()


def result(episode: Any, trained: set[str]) -> EpisodeResult:
    """The reward of the episode's trainable trace; ``EpisodeFailed`` for an episode in
    error, with no such trace, or whose scoring did not run."""
    if not episode.ok:
        err = episode.last_error or next((t.last_error for t in episode.traces
                                          if t.last_error), None)
        why = f"{err.type}: {err.message}" if err else "no error recorded"
        raise EpisodeFailed(f"verifiers episode {episode.id} failed ({why})")
    traces = [t for t in episode.traces if t.id in trained]
    if len(traces) != 1:
        raise EpisodeFailed(f"verifiers episode {episode.id} has {len(traces)} trainable "
                            "agent runs; gspo trains one per episode (its rollout)")
    if not traces[0].calls:
        raise EpisodeFailed(f"verifiers episode {episode.id}: its agent made no model call "
                            "(the harness ended without asking the model)")
    unscored = sorted(k for k, v in traces[0].rewards.items() if v is None)
    if unscored:
        raise EpisodeFailed(f"verifiers episode {episode.id}: rewards not scored: "
                            f"{', '.join(unscored)}")
    return EpisodeResult(reward=float(traces[0].reward))
