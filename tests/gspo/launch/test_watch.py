"""``gspo up`` following its learner (gspo_rl.launch.watch): the steps it shows, and the three
ends of the watch: the learner's final-evaluation wait (then gspo up evaluates), its exit, the
clock. The learner process is a stand-in (its exit code), its metrics a real JSONL file."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from pathlib import Path
from typing import Any

from gspo_rl.launch.runlog import JsonlTail
from gspo_rl.launch.watch import WAIT_EVENT, until_exit, watch_learner
from gspo_rl.learner.runtime.final_eval import WAIT_EVENT as LEARNER_WRITES


class _Procs:
    def __init__(self, code: int | None = None) -> None:
        self.code = code

    def check(self, name: str) -> None:
        pass

    def exit_code(self, name: str) -> int | None:
        return self.code


async def _idle() -> None:
    await asyncio.sleep(3600)


def _watch(metrics: Path, procs: _Procs, minutes: float) -> tuple[int | None, list[Any]]:
    steps: deque[dict[str, Any]] = deque(maxlen=5)

    async def go() -> int | None:
        runner = asyncio.create_task(_idle())
        try:
            return await watch_learner(minutes, runner, procs, JsonlTail(metrics), steps,
                                       lambda: None)
        finally:
            runner.cancel()

    return asyncio.run(go()), [s["step"] for s in steps]


def test_the_learners_wait_record_ends_the_watch(tmp_path: Path) -> None:
    assert WAIT_EVENT == LEARNER_WRITES
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in [
        {"event": "step", "step": 1}, {"event": "step", "step": 2},
        {"event": WAIT_EVENT, "step": 2, "version": 2, "wait_s": 900.0}]))
    assert _watch(metrics, _Procs(), minutes=1) == (2, [1, 2])  # the version it waits for


def test_an_exit_or_the_clock_ends_it_without_a_final_evaluation_wait(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"event": "step", "step": 1}) + "\n")
    assert _watch(metrics, _Procs(code=0), minutes=1) == (None, [1])
    assert _watch(metrics, _Procs(), minutes=0) == (None, [1])


def test_until_exit_is_bounded(tmp_path: Path) -> None:
    asyncio.run(until_exit(_Procs(code=0), "learner", 60.0))  # at once
    loop_time = asyncio.run(_timed(until_exit(_Procs(), "learner", 0.6)))
    assert 0.6 <= loop_time < 5


async def _timed(aw: Any) -> float:
    t0 = asyncio.get_running_loop().time()
    await aw
    return asyncio.get_running_loop().time() - t0


def test_an_evaluation_after_the_run_is_bounded_and_said(monkeypatch, caplog) -> None:
    """An evaluation that hangs after the clock ran out (or the learner finished) is said while
    it lasts and cancelled at ``EVAL_WAIT_S``: gspo up always ends."""
    import pytest

    from gspo_rl.launch import drive

    monkeypatch.setattr(drive, "EVAL_WAIT_S", 0.4)
    monkeypatch.setattr(drive, "EVAL_SAY_S", 0.1)
    assert asyncio.run(drive.bounded(asyncio.sleep(0.01, result=7), "quick")) == 7
    with caplog.at_level("WARNING"), pytest.raises(TimeoutError, match="longer than 0.4 s"):
        asyncio.run(drive.bounded(_idle(), "the final evaluation"))
    said = [r.getMessage() for r in caplog.records]
    assert any("waiting for the final evaluation" in m for m in said), said
    assert any("cancelled" in m for m in said), said
