"""The SDK's group runner survives failing episodes (gspo_rl.client.failures): real server (hf
engine, tiny model), real redis, the official openai client. Failures are real server errors (a 409
for an episode that rewrites its history) and an environment's own exception (a crashed
tool); the run goes on, retries or abandons as configured, and counts every failure."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import openai
import pytest

from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.environment import EpisodeSession, MultiTurnEnvironment
from gspo_rl.client.failures import FailurePolicy, RunStats, describe_error
from gspo_rl.client.runner import arun_groups
from tests.helpers.serving import API_KEY, Served


class FlakyEnv(MultiTurnEnvironment):
    """Tasks 1, 2, 3...; ``always`` tasks fail on every attempt (a 409 from the server),
    ``once`` tasks fail on their first attempt only (a crashed tool)."""

    group_size = 2

    def __init__(self, always: set[int], once: set[int]) -> None:
        self.always, self.once = always, once
        self.next_task = 0
        self.attempts: dict[int, int] = {}

    def sample_task(self, rng: random.Random) -> int:
        self.next_task += 1
        return self.next_task

    def group_metadata(self, task: Any) -> dict[str, Any]:
        self.attempts[task] = self.attempts.get(task, 0) + 1
        return {"task": task}

    async def episode(self, task: int, session: EpisodeSession) -> float:
        client = openai.AsyncOpenAI(base_url=session.openai_base_url, api_key=session.api_key,
                                    max_retries=0, timeout=60)
        msgs = [{"role": "user", "content": f"task {task}"}]
        c = await client.chat.completions.create(model=session.model, messages=msgs,
                                                 max_tokens=4, extra_body=session.extra_body)
        if task in self.always:  # history rewritten by the agent: the server says 409
            await client.chat.completions.create(
                model=session.model, extra_body=session.extra_body, max_tokens=4,
                messages=[{"role": "user", "content": "another task"},
                          {"role": "assistant", "content": c.choices[0].message.content},
                          {"role": "user", "content": "go on"}])
        if task in self.once and self.attempts[task] == 1:
            raise RuntimeError("the lookup tool crashed")
        return float(task % 2)


def _run(served: Served, env: FlakyEnv, n: int, policy: FailurePolicy,
         stats: RunStats) -> list[Any]:
    async def main() -> list[Any]:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await arun_groups(env, client, n, concurrency=1, failures=policy,
                                     stats=stats)
    return asyncio.run(main())


def test_failed_groups_are_retried_or_abandoned_and_the_run_goes_on(served: Served) -> None:
    env, stats = FlakyEnv(always={2}, once={4}), RunStats()
    outcomes = _run(served, env, 5, FailurePolicy(on_error="retry", max_retries=1), stats)
    assert sorted(o.task for o in outcomes) == [1, 3, 4, 5]  # 2 abandoned, 4 retried once
    assert env.attempts == {1: 1, 2: 2, 3: 1, 4: 2, 5: 1}
    assert (stats.completed, stats.failed_attempts, stats.retried, stats.abandoned) == (4, 3,
                                                                                      2, 1)
    assert stats.errors == {"ConflictError 409 history_mismatch": 2, "RuntimeError": 1}
    assert "1 groups abandoned" in stats.summary()


def test_abandon_without_retry(served: Served) -> None:
    env, stats = FlakyEnv(always=set(), once={1, 2}), RunStats()
    outcomes = _run(served, env, 3, FailurePolicy(on_error="abandon"), stats)
    assert [o.task for o in outcomes] == [3]
    assert (stats.completed, stats.abandoned, stats.retried) == (1, 2, 0)


def test_raise_policy_and_the_consecutive_failure_limit(served: Served) -> None:
    with pytest.raises(RuntimeError, match="crashed"):
        _run(served, FlakyEnv(always=set(), once={1}), 2, FailurePolicy(on_error="raise"),
             RunStats())
    stats = RunStats()
    with pytest.raises(openai.ConflictError):
        _run(served, FlakyEnv(always=set(range(1, 10)), once=set()), 9,
             FailurePolicy(on_error="abandon", max_consecutive_failures=3), stats)
    assert stats.abandoned == 2 and stats.failed_attempts == 3


def test_describe_error_and_policy_checks() -> None:
    from gspo_rl.client.errors import error_for_status

    exc = error_for_status(400, {"error": {"message": "bad", "code": "invalid_messages"}})
    assert describe_error(exc) == "BadRequestError 400 invalid_messages"
    with pytest.raises(ValueError):
        FailurePolicy(on_error="skip")  # type: ignore[arg-type]
