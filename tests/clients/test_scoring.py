"""Scoring in worker processes (gspo_rl.client.scoring), with real processes: results equal
in-process scoring; a call past its limit is killed and the pool answers the next one; a
crashed worker is replaced; a scorer's exception comes back with its type, message and
traceback; an environment loaded from a file scores in workers (and one that cannot be pickled
is refused, naming why); math-verify runs in a worker's main thread; and against a real rollout
server a group whose scoring hangs is given up while the other groups are published."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gspo_rl.client.environment import (
    SingleTurnEnvironment,
    TasksExhausted,
    close_scoring,
    score_group,
    scoring_pool,
)
from gspo_rl.client.scoring import ScoringCrashed, ScoringError, ScoringPool, ScoringTimeout

if TYPE_CHECKING:
    from tests.helpers.serving import Served


def make_scorer(hang_s: float = 30.0) -> Any:
    """Built once in each worker: ``kind`` picks what one call does."""

    def scorer(kind: str, value: int = 0) -> Any:
        if kind == "square":
            return float(value * value)
        if kind == "hang":
            time.sleep(hang_s)
        if kind == "die":
            os._exit(7)
        if kind == "raise":
            raise ValueError(f"no answer in completion {value}")
        if kind == "where":
            return os.getpid(), threading.current_thread() is threading.main_thread()
        raise AssertionError(kind)

    return scorer


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def test_results_equal_scoring_in_process() -> None:
    calls = [("square", i) for i in range(20)]

    async def main() -> tuple[list[Any], list[Any]]:
        async with ScoringPool(make_scorer, workers=2, timeout_s=10) as pool:
            many = await pool.score_many(calls)
            where = await pool.score_many([("where",)] * 4)
            return many, where

    many, where = run(main())
    assert many == [make_scorer()(*c) for c in calls]
    assert all(pid != os.getpid() and main_thread for pid, main_thread in where)
    assert len({pid for pid, _ in where}) <= 2  # never more than `workers` processes


def test_a_call_past_the_limit_is_killed_and_the_pool_answers_the_next() -> None:
    async def main() -> tuple[float, set[int], float]:
        async with ScoringPool(make_scorer, workers=1, timeout_s=0.5) as pool:
            first = await pool.score("where")
            t0 = time.monotonic()
            with pytest.raises(ScoringTimeout, match="no result within 0.5s"):
                await pool.score("hang")
            waited = time.monotonic() - t0
            second = await pool.score("where")
            return waited, {first[0], second[0]}, await pool.score("square", 3)

    waited, pids, answer = run(main())
    assert 0.5 <= waited < 5.0
    assert len(pids) == 2 and answer == 9.0  # a new worker answers


def test_a_crashed_worker_is_replaced() -> None:
    async def main() -> tuple[str, float]:
        async with ScoringPool(make_scorer, workers=1, timeout_s=10) as pool:
            with pytest.raises(ScoringCrashed) as err:
                await pool.score("die")
            return str(err.value), await pool.score("square", 4)

    message, answer = run(main())
    assert "exit code 7" in message and answer == 16.0


def test_an_exception_carries_its_type_message_and_traceback() -> None:
    async def main() -> tuple[ScoringError, float]:
        async with ScoringPool(make_scorer, workers=1, timeout_s=10) as pool:
            with pytest.raises(ScoringError) as err:
                await pool.score("raise", 5)
            with pytest.raises(ScoringError, match="do not pickle"):
                await pool.score("square", threading.Lock())  # never reaches the worker
            return err.value, await pool.score("square", 2)  # the worker lives on

    err, answer = run(main())
    assert type(err) is ScoringError and err.exc_type == "ValueError"
    assert err.message == "no answer in completion 5"
    assert "in scorer" in err.traceback_text and "ValueError" in err.traceback_text
    assert answer == 4.0


def broken_scorer() -> Any:
    raise RuntimeError("no model to judge with")


def test_a_scorer_that_cannot_be_built_fails_every_call_without_restarting() -> None:
    async def main() -> list[str]:
        pool = ScoringPool(broken_scorer, workers=1, timeout_s=10)
        out = []
        for _ in range(2):
            t0 = time.monotonic()
            with pytest.raises(ScoringError) as err:
                await pool.score("square", 1)
            out.append((str(err.value), time.monotonic() - t0))
        pool.close()
        pool.close()  # idempotent
        with pytest.raises(ScoringError, match="closed"):
            await pool.score("square", 1)
        return out

    (first, _), (second, again_s) = run(main())
    assert first == second == ("RuntimeError: a scoring worker could not start: no model to "
                               "judge with")
    assert again_s < 0.1  # remembered, not a new process


def test_preload_imports_a_file_module_in_each_worker_first(tmp_path: Path) -> None:
    import importlib.util
    import sys

    path = tmp_path / "helpers_for_scoring.py"
    path.write_text("def make():\n    return lambda x: 2 * x\n")
    spec = importlib.util.spec_from_file_location("my_scoring_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["my_scoring_helpers"] = module  # a name no fresh process can import
    spec.loader.exec_module(module)

    async def main() -> float:
        async with ScoringPool(module.make, workers=1, timeout_s=10,
                               preload=[str(path)]) as pool:
            return await pool.score(21)

    try:
        assert run(main()) == 42
    finally:
        del sys.modules["my_scoring_helpers"]


ENV_FILE = """
import os
from gspo_rl.client import SingleTurnEnvironment


class FileEnv(SingleTurnEnvironment):
    score_workers = 2

    def sample_task(self, rng):
        return "x"

    def prompt(self, task):
        return task

    def score(self, task, completion):
        return float(len(completion)) + (0.5 if os.getpid() != self.parent else 0.0)

    def tally(self, task, scored):
        self.tallied += 1
        return scored

    def __init__(self):
        self.parent, self.tallied = os.getpid(), 0
"""


def test_an_environment_loaded_from_a_file_scores_in_workers(tmp_path: Path) -> None:
    from gspo_rl.client.loading import load_environment

    (tmp_path / "file_env.py").write_text(ENV_FILE)
    env = load_environment(f"{tmp_path / 'file_env.py'}:FileEnv")
    assert isinstance(env, SingleTurnEnvironment)
    texts = ["a", "bb", "ccc", "dddd"]
    try:
        rewards = run(score_group(env, "x", texts))
        assert scoring_pool(env) is env._scoring_pool  # kept for the next group
    finally:
        close_scoring(env)
        close_scoring(env)
    assert rewards == [1.5, 2.5, 3.5, 4.5] and env.tallied == 4  # scored there, tallied here


class LockedEnv(SingleTurnEnvironment):
    score_workers = 1

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def sample_task(self, rng: random.Random) -> str:
        return "x"

    def prompt(self, task: str) -> str:
        return task

    def score(self, task: str, completion: str) -> float:
        return 1.0


def test_an_environment_that_cannot_be_pickled_is_refused_naming_why() -> None:
    with pytest.raises(TypeError, match=r"LockedEnv cannot score in worker processes.*lock"):
        scoring_pool(LockedEnv())


def test_math_verify_judges_in_a_worker_and_the_counts_stay_here() -> None:
    pytest.importorskip("math_verify")
    from gspo_rl.client.tasks.environment import DataEnvironment
    from gspo_rl.client.tasks.sampler import TaskMixture, TaskSource
    from gspo_rl.client.tasks.task import Task
    from gspo_rl.client.verifiers import make_verifier

    task = Task(id="t0", source="s", answer="\\frac{1}{2}", prompt="1/2?")
    env = DataEnvironment(TaskMixture([TaskSource("s", [task])]), make_verifier("math"))
    assert env.score_workers == 2  # the math verifier's default
    texts = ["so it is \\boxed{0.5}", "\\boxed{\\frac{2}{4}}", "it is 3", "no idea"]
    try:
        rewards = run(score_group(env, task, texts))
    finally:
        close_scoring(env)
    assert rewards == [1.0, 1.0, 0.0, 0.0]
    assert env.summary()["s"] == {"samples": 4, "reward_mean": 0.5, "accuracy": 0.5}


class HangOnTask(SingleTurnEnvironment):
    """Tasks t0..t3 (then exhausted); scoring task ``hang`` never ends."""

    group_size = 4
    sampling = {"temperature": 1.0, "max_tokens": 8}
    score_workers = 2
    score_timeout_s = 2.0

    def __init__(self, hang: str) -> None:
        self.hang, self.left = hang, [f"t{i}" for i in range(4)]

    def sample_task(self, rng: random.Random) -> str:
        if not self.left:
            raise TasksExhausted
        return self.left.pop(0)

    def prompt(self, task: str) -> str:
        return f"Task {task}:"

    def group_metadata(self, task: str) -> dict[str, Any]:
        return {"task": task}

    def score(self, task: str, completion: str) -> float:
        if task == self.hang:
            time.sleep(120)
        return zlib.crc32(completion.encode()) % 1000 / 1000  # distinct texts: variance


def test_a_hanging_score_fails_its_group_only(served: Served) -> None:
    from gspo_rl.client.client import AsyncGSPOClient
    from gspo_rl.client.failures import FailurePolicy, RunStats
    from gspo_rl.client.runner import arun_groups
    from tests.helpers.serving import API_KEY

    env, stats = HangOnTask(hang="t1"), RunStats()

    async def main() -> tuple[list[Any], list[str]]:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            outcomes = await arun_groups(env, client, None, concurrency=4, stats=stats,
                                         failures=FailurePolicy(on_error="abandon"))
            states = [str((await client.group(o.group_id))["state"]) for o in outcomes]
            return outcomes, states

    t0 = time.monotonic()
    try:
        outcomes, states = run(main())
    finally:
        close_scoring(env)
    assert sorted(o.task for o in outcomes) == ["t0", "t2", "t3"]
    assert states == ["published"] * 3
    assert stats.abandoned == 1 and stats.errors == {"ScoringTimeout": 1}
    assert time.monotonic() - t0 < 30
