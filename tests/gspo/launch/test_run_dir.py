"""gspo up's run directory: every run starts from scratch, the earlier one is kept aside
(a second `bash scripts/up.sh` failed: the learner refused the first run's checkpoints)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gspo_rl.launch.run_dir import RunDirError, set_aside_previous_run


def _a_run(run_dir: Path, marker: str) -> None:
    (run_dir / "checkpoints" / "step-00000041").mkdir(parents=True)
    (run_dir / "redis").mkdir()
    (run_dir / "metrics.jsonl").write_text(marker)
    (run_dir / "server.log").write_text("")


def test_an_earlier_run_is_moved_aside_and_the_one_before_it_replaced(tmp_path: Path) -> None:
    run_dir = tmp_path / "up"
    _a_run(run_dir, "first")
    assert set_aside_previous_run(run_dir) == (tmp_path / "up.previous").resolve()
    assert not run_dir.exists()
    assert (tmp_path / "up.previous" / "metrics.jsonl").read_text() == "first"
    _a_run(run_dir, "second")
    set_aside_previous_run(run_dir)
    assert (tmp_path / "up.previous" / "metrics.jsonl").read_text() == "second"
    assert not (tmp_path / "up.previous" / "up.previous").exists()


def test_a_missing_or_empty_run_dir_is_left_as_it_is(tmp_path: Path) -> None:
    assert set_aside_previous_run(tmp_path / "none") is None
    (tmp_path / "empty").mkdir()
    assert set_aside_previous_run(tmp_path / "empty") is None
    assert (tmp_path / "empty").is_dir()


def test_a_directory_with_other_files_is_refused_and_untouched(tmp_path: Path) -> None:
    run_dir = tmp_path / "project"
    _a_run(run_dir, "x")
    (run_dir / "pyproject.toml").write_text("")
    with pytest.raises(RunDirError, match="pyproject.toml"):
        set_aside_previous_run(run_dir)
    assert (run_dir / "pyproject.toml").exists() and (run_dir / "checkpoints").is_dir()
    assert not (tmp_path / "project.previous").exists()
