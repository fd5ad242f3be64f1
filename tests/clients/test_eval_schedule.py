"""When ``EvalWatcher`` evaluates (gspo_rl.client.evals.watcher): at the first version it sees,
then at each multiple of ``every`` (0, 5, 10, ...), never twice at one version, a final
evaluation only for a version not yet evaluated. The server's version is scripted here (the
schedule is the watcher's own logic; evaluations against a real server are
tests/clients/test_data_environment.py's and the gspo up tests')."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from gspo_rl.client.evals.watcher import EvalWatcher


class ScriptedServer:
    """``health()`` answers the next version of ``versions`` (the last one for ever after)."""

    def __init__(self, versions: list[int]) -> None:
        self._versions: Iterator[int] = iter(versions)
        self.version = versions[0]

    async def health(self) -> dict[str, Any]:
        self.version = next(self._versions, self.version)
        return {"policy_version": self.version}


def watch(versions: list[int], every: int, eval_takes: int = 0) -> tuple[EvalWatcher, list[int]]:
    """Runs a watcher over ``versions`` (one per poll); an evaluation lasts ``eval_takes``
    polls of the server (the learner moves on meanwhile). Returns the versions evaluated."""
    server = ScriptedServer(versions)
    watcher = EvalWatcher(env=None, tasks=[], every=every, poll_s=0.0)  # type: ignore[arg-type]
    evaluated: list[int] = []

    async def run_once(client: Any) -> Any:
        start = client.version
        for _ in range(eval_takes):
            await client.health()
        evaluated.append(start)
        report = SimpleNamespace(policy_version=start, newest_version=client.version)
        watcher.reports.append(report)  # type: ignore[arg-type]
        return report

    watcher.run_once = run_once  # type: ignore[method-assign]

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(server, stop))  # type: ignore[arg-type]
        while server.version < versions[-1]:
            await asyncio.sleep(0)
        for _ in range(5):
            await asyncio.sleep(0)
        stop.set()
        await task

    asyncio.run(go())
    return watcher, evaluated


def test_every_multiple_once_when_evaluations_are_quick() -> None:
    _, evaluated = watch(list(range(0, 31)) + [30, 30, 30], every=5)
    assert evaluated == [0, 5, 10, 15, 20, 25, 30]


def test_a_version_seen_late_is_evaluated_when_seen_and_the_schedule_stays_on_multiples() -> None:
    # the poll sees 0, 3, 7, 12, 13, 21, ...: 5 is evaluated at 7, 10 at 12, 15 and 20 at 21
    _, evaluated = watch([0, 3, 7, 12, 13, 21, 22, 26, 30, 30], every=5)
    assert evaluated == [0, 7, 12, 21, 26, 30]


def test_versions_passed_during_an_evaluation_are_not_made_up() -> None:
    # each evaluation lasts 3 polls (3 versions): the next due multiple is the one after the
    # evaluated version, evaluated when first seen
    _, evaluated = watch(list(range(0, 21)), every=2, eval_takes=3)
    assert evaluated[0] == 0 and len(evaluated) == len(set(evaluated))
    assert all(b - a >= 2 for a, b in zip(evaluated, evaluated[1:], strict=False))


def test_the_final_evaluation_runs_only_for_a_version_not_yet_evaluated() -> None:
    watcher, evaluated = watch(list(range(0, 11)), every=5)
    assert evaluated == [0, 5, 10]
    done_at_10 = ScriptedServer([10])
    final = watcher.run_final(done_at_10, trained=10)  # type: ignore[arg-type]
    assert asyncio.run(final) is None
    assert evaluated == [0, 5, 10]
    moved_on = ScriptedServer([11])
    asyncio.run(watcher.run_final(moved_on, trained=11))  # type: ignore[arg-type]
    assert evaluated == [0, 5, 10, 11]
