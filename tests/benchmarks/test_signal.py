"""``bench_signal.py``'s report of both settings, on results made up here (its smoke case
runs one setting only: each is a whole ``gspo up`` run)."""

from __future__ import annotations

import math

import pytest

from benchmarks.bench_signal import late_rate, report

KEYS = ("steps", "seconds", "groups_generated", "groups_trained", "tokens_generated",
        "tokens_trained", "group_share", "token_share", "sampled_reward", "eval",
        "late_groups_per_s")


def result(seconds: float, token_share: float) -> dict[str, float]:
    return {**dict.fromkeys(KEYS, 1.0), "seconds": seconds, "token_share": token_share}


def test_the_report_gives_medians_and_ratios_on_over_off(
        capsys: pytest.CaptureFixture[str]) -> None:
    report("math", {"off": [result(100, 0.01), result(60, 0.02), result(80, 0.0)],
                    "on": [result(50, 0.05), result(30, 0.04), result(40, 0.2)]})
    out = capsys.readouterr().out
    assert "math: median over 3 seeds" in out
    assert "seconds: off     80.000   on     40.000" in out
    # the seed where nothing trained with it off has no share ratio: 5x and 2x remain
    assert "ratio on/off, trained token share: 3.50 [2.00..5.00]" in out
    assert "ratio on/off, seconds: 0.50" in out


def test_a_report_where_nothing_trained_off_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    report("rg", {"off": [result(10, 0.0)], "on": [result(10, 0.3)]})
    assert "trained token share: n/a (nothing trained with it off)" in capsys.readouterr().out


def test_the_late_rate_is_the_pace_of_the_second_half() -> None:
    assert math.isnan(late_rate([5.0]))
    # 10 s of sampling: 2 groups in the first half, 4 at or after the middle (5 s)
    assert late_rate([0, 1, 5, 7, 9, 10]) == pytest.approx(4 / 5)
