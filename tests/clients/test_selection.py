"""Task selection by difficulty against a real server (real Redis, the hf engine on the tiny
model): the bands from the statistics every server keeps; a solved or failed task is passed
over (still revisited), a learnable or new one played; the band reaches the group's metadata;
statistics that cannot be read leave the run unselected, not stopped."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import msgpack
import pytest
import redis

from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.environment import SingleTurnEnvironment
from gspo_rl.client.runner import arun_groups
from gspo_rl.client.selection import TaskSelection, band_of
from gspo_rl.contract.schema import Keys
from tests.conftest import RedisServer, free_port
from tests.helpers.serving import API_KEY, Served

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def end_group(served: Served, task_id: str, rewards: list[float]) -> None:
    r = httpx.post(f"{served.url}/v1/rollouts", headers=AUTH, timeout=60, json={
        "prompt_token_ids": [1, 2], "max_tokens": 2, "n": len(rewards),
        "metadata": {"task_id": task_id}})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{served.url}/v1/rewards", headers=AUTH, timeout=60, json=[
        {"rollout_id": x["rollout_id"], "reward": v}
        for x, v in zip(r.json()["rollouts"], rewards, strict=True)])
    assert r.status_code == 200, r.text


class Cycle(SingleTurnEnvironment):
    """Tasks in a fixed cycle, each named by its id; a score that gives a signal."""

    group_size = 2
    sampling = {"max_tokens": 2}

    def __init__(self, ids: list[str], selection: TaskSelection | None = None) -> None:
        self.ids, self.i = ids, 0
        self.selection = selection

    def sample_task(self, rng: random.Random) -> str:
        self.i += 1
        return self.ids[(self.i - 1) % len(self.ids)]

    def prompt(self, task: str) -> str:
        return f"task {task}:"

    def score(self, task: str, completion: str) -> float:
        return float(len(completion) % 2)

    def group_metadata(self, task: str) -> dict[str, Any]:
        return {"task_id": task}


def test_bands() -> None:
    assert band_of(None) == "new"
    assert band_of({"groups": 3, "streak": 0, "streak_value": 1.0}) == "learnable"
    assert band_of({"groups": 3, "streak": 2, "streak_value": 1.0}) == "solved"
    assert band_of({"groups": 3, "streak": 1, "streak_value": 0.0}) == "failed"
    assert band_of({"groups": 3, "streak": 1, "streak_value": 0.5}) == "flat"
    assert band_of({"groups": 3, "streak": 1, "streak_value": 1.0}, streak=2) == "learnable"
    with pytest.raises(ValueError, match="revisit"):
        TaskSelection(revisit=2.0)


def test_solved_and_failed_tasks_are_passed_over_but_revisited(served: Served) -> None:
    end_group(served, "sel-solved", [1.0, 1.0])
    end_group(served, "sel-failed", [0.0, 0.0])
    end_group(served, "sel-open", [0.0, 1.0])

    async def draws(revisit: float, n: int) -> tuple[list[tuple[str, str]], TaskSelection]:
        selection = TaskSelection(revisit=revisit)
        env = Cycle(["sel-solved", "sel-failed", "sel-open", "sel-new"], selection)
        rng = random.Random(0)
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return [await selection.draw(env, rng, client) for _ in range(n)], selection

    never, sel = asyncio.run(draws(0.0, 20))
    assert {t for t, _ in never} == {"sel-open", "sel-new"}
    assert dict(sel.counts)["passed_over_solved"] >= 5 and sel.counts["passed_over_failed"] >= 5
    assert {b for _, b in never} == {"learnable", "new"}
    sometimes, _ = asyncio.run(draws(0.5, 60))
    assert {t for t, _ in sometimes} >= {"sel-solved", "sel-failed"}, "revisited"


def test_the_band_reaches_the_groups_metadata(served: Served, redis_mod: RedisServer) -> None:
    end_group(served, "meta-solved", [1.0, 1.0])
    env = Cycle(["meta-solved", "meta-x"], TaskSelection(revisit=0.0))

    async def main() -> list[Any]:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await arun_groups(env, client, 3, concurrency=1)

    outcomes = asyncio.run(main())
    r = redis.Redis.from_url(redis_mod.url)

    for o in outcomes:
        meta = msgpack.unpackb(r.hget(Keys().group(o.group_id), "metadata"))
        assert meta["task_id"] == "meta-x" and meta["difficulty"] in ("new", "learnable")
    r.close()


def test_unreadable_statistics_leave_the_run_unselected() -> None:
    selection = TaskSelection(revisit=0.0)
    env = Cycle(["a", "b"], selection)

    async def main() -> tuple[str, str]:
        async with AsyncGSPOClient(f"http://127.0.0.1:{free_port()}", api_key=API_KEY,
                                   retry=_no_retry()) as client:
            return await selection.draw(env, random.Random(0), client)

    assert asyncio.run(main()) == ("a", "new")


def _no_retry() -> Any:
    from gspo_rl.client.client import RetryPolicy

    return RetryPolicy(attempts=1, outage_patience_s=0, admission_patience_s=0)
