"""``gspo up``'s processes pinned to cores (``UpConfig.cpus``, for benchmarks/bench_async.py):
the child runs on exactly those cores from its first instruction, with as many torch threads;
an unnamed process is not pinned. And the letters task's verifier (benchmarks/tasks)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from benchmarks.bench_async import core_split
from benchmarks.tasks.letters_check import check
from gspo_rl.launch.up import Processes

PROBE = "import os; print(sorted(os.sched_getaffinity(0)), os.environ.get('OMP_NUM_THREADS'))"


def test_a_named_process_runs_on_its_cores_only(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    procs = Processes(tmp_path, {"pinned": cores[-1:]})
    try:
        for name in ("pinned", "free"):
            assert procs.start(name, [sys.executable, "-c", PROBE]).wait(timeout=60) == 0
    finally:
        procs.stop_all()
    assert (tmp_path / "pinned.log").read_text().split() == [f"[{cores[-1]}]", "1"]
    assert (tmp_path / "free.log").read_text().startswith(str(cores))


def test_the_two_sides_get_disjoint_cores() -> None:
    split = core_split(pin=True)
    if len(os.sched_getaffinity(0)) < 2:
        assert split == {}
        return
    assert split["server"] == split["redis"]
    assert not set(split["server"]) & set(split["learner"])
    assert set(split["server"]) | set(split["learner"]) == os.sched_getaffinity(0)
    assert core_split(pin=False) == {}


@pytest.mark.parametrize("completion, reward", [
    ("apple bear cat", 1.0), (" Apple, zoo-cat!", 2 / 3), ("zoo", 0.0), ("", 0.0),
    ("a b c d e f", 1.0), ("x1y2 a", 1 / 3)])
def test_letters_reward_is_the_fraction_of_three_words_in_the_half(completion, reward) -> None:
    assert check(completion, "abcdefghijklm", {}) == pytest.approx(reward)


def test_letters_refuses_an_answer_it_cannot_use() -> None:
    with pytest.raises(ValueError, match="letters"):
        check("apple", "", {})
