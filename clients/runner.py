"""The run loop: groups of one environment or of a mix, ``concurrency`` at a time, with the
failure policy, resampling of equal-reward groups, task selection by difficulty and every
environment's ``serving`` context (``arun_groups``; ``run_groups`` on a fresh event loop).
Both are importable from ``gspo_rl.client``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gspo_rl.client.client import AsyncGSPOClient, RetryPolicy
from gspo_rl.client.environment import (
    EQUAL_REWARDS,
    Environment,
    GroupOutcome,
    MultiTurnEnvironment,
    TasksExhausted,
    arun_group,
    served_model,
)
from gspo_rl.client.failures import FailurePolicy, RunStats, record_failure
from gspo_rl.client.mixture import Member, Mix, members_of, serving_all


async def _play(member: Member, client: AsyncGSPOClient, task: Any, model: str | None,
                failures: FailurePolicy, stats: RunStats, band: str = "") -> GroupOutcome | None:
    """The task's group, retried by the failure policy (None when abandoned), and played
    again while the server drops it for equal rewards (``resample_equal_rewards``)."""
    env = member.env
    outcome = await _attempt(member, client, task, model, failures, stats, band)
    for _ in range(env.resample_equal_rewards):
        if outcome is None or outcome.fate != EQUAL_REWARDS:
            break
        stats.resampled += 1
        outcome = await _attempt(member, client, task, model, failures, stats, band)
    if outcome is not None and outcome.fate == EQUAL_REWARDS:
        stats.equal_rewards_kept += 1
    return outcome


async def _attempt(member: Member, client: AsyncGSPOClient, task: Any, model: str | None,
                   failures: FailurePolicy, stats: RunStats, band: str) -> GroupOutcome | None:
    for attempt in range(failures.max_retries + 1):
        try:
            outcome = await arun_group(member.env, client, task, model, member.name, band)
        except Exception as exc:  # noqa: BLE001 - counted and re-raised by the policy
            if not record_failure(stats, failures, exc, attempt, repr(task)[:80]):
                return None
        else:
            stats.completed += 1
            stats.consecutive_failures = 0
            return outcome
    return None


async def _next_task(mix: Mix, rng: random.Random,
                     client: AsyncGSPOClient) -> tuple[Member, Any, str] | None:
    """A member by weight, its next task and the task's difficulty band (its ``selection``
    draws it, when it has one: ``gspo_rl.client.selection``; else ""); None once every
    member ran out of tasks."""
    while mix.live:
        member = mix.pick(rng)
        selection = getattr(member.env, "selection", None)
        try:
            if selection is not None and selection.enabled:
                task, band = await selection.draw(member.env, rng, client)
                return member, task, band
            return member, member.env.sample_task(rng), ""
        except TasksExhausted:
            mix.retire(member)
    return None


async def arun_groups(
    env: Environment | Mix,
    client: AsyncGSPOClient,
    num_groups: int | None,
    *,
    concurrency: int = 4,
    seed: int = 0,
    model: str | None = None,
    on_group: Callable[[GroupOutcome], None] | None = None,
    stop: asyncio.Event | None = None,
    gate: Callable[[], Awaitable[None]] | None = None,
    failures: FailurePolicy = FailurePolicy(),
    stats: RunStats | None = None,
) -> list[GroupOutcome]:
    """Run ``num_groups`` groups (forever if None, until ``stop`` is set), ``concurrency`` at a
    time, of one environment or of a ``Mix`` (each group from one member, by weight). ``gate``
    is awaited before each group starts: backpressure, e.g. wait while the learner has more
    groups waiting than it can train within its staleness bound. A failed group is retried or
    abandoned by ``failures`` and counted in ``stats`` (pass one to read the counts);
    ``num_groups`` counts tasks started, abandoned ones included. An error the policy does not
    absorb cancels the rest and propagates. ``model``: the served model's name for the
    episodes' chat completions (None: asked from the server once, when needed). Every
    environment's ``serving`` context is held for the run (``gspo_rl.client.mixture``)."""
    rng = random.Random(seed)
    mix = env if isinstance(env, Mix) else Mix(members_of(env))
    if model is None and any(isinstance(m.env, MultiTurnEnvironment) for m in mix.members):
        model = await served_model(client)
    outcomes: list[GroupOutcome] = []
    started = 0
    stop = stop or asyncio.Event()
    stats = stats if stats is not None else RunStats()

    async def worker() -> None:
        nonlocal started
        while not stop.is_set() and (num_groups is None or started < num_groups):
            if gate is not None:
                await gate()
                if stop.is_set():
                    break
            started += 1  # counted before the draw awaits: no other worker overshoots
            drawn = await _next_task(mix, rng, client)
            if drawn is None:
                started -= 1
                break
            outcome = await _play(drawn[0], client, drawn[1], model, failures, stats,
                                  drawn[2])
            if outcome is None:
                continue
            outcomes.append(outcome)
            if on_group is not None:
                on_group(outcome)

    try:
        async with serving_all(mix), asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(worker())
    except ExceptionGroup as group:  # one worker's error: raise it as itself
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    return outcomes


Alongside = Callable[[AsyncGSPOClient, asyncio.Event], Coroutine[Any, Any, Any]]
"""A side task run next to the groups (an evaluation watcher): started with the run's client
and an event that is set once the groups end; awaited before the run returns."""


def run_groups(env: Environment, base_url: str, num_groups: int | None, *,
               api_key: str | None = None, concurrency: int = 4, seed: int = 0,
               model: str | None = None, retry: RetryPolicy = RetryPolicy(),
               on_group: Callable[[GroupOutcome], None] | None = None,
               failures: FailurePolicy = FailurePolicy(),
               stats: RunStats | None = None,
               alongside: Alongside | None = None,
               stop: asyncio.Event | None = None) -> list[GroupOutcome]:
    """Synchronous entry point: runs ``arun_groups`` on a fresh event loop (and
    ``alongside``, if given, until the groups end); ``stop`` (set from ``on_group``, say)
    starts no new group."""

    async def main() -> list[GroupOutcome]:
        async with AsyncGSPOClient(base_url, api_key=api_key, retry=retry) as client:
            done = asyncio.Event()
            side = asyncio.create_task(alongside(client, done)) if alongside else None
            try:
                return await arun_groups(env, client, num_groups, concurrency=concurrency,
                                         seed=seed, model=model, on_group=on_group,
                                         stop=stop, failures=failures, stats=stats)
            finally:
                done.set()
                if side is not None:
                    await side

    return asyncio.run(main())
