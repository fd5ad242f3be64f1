"""The reward window behind the learner's target stop (gspo_rl.learner.runtime.target): the
mean reward per sample over the newest span of at least ``window`` finished groups, from running
totals."""

from __future__ import annotations

import pytest

import gspo_rl.learner.runtime.target
from gspo_rl.learner.runtime.target import FinishedTotals, RewardWindow, TargetStop, drain


def totals(groups: int, ones: int, size: int = 2) -> FinishedTotals:
    """``groups`` groups of ``size`` samples, ``ones`` of them rewarded 1.0, the rest 0."""
    return FinishedTotals(groups=groups, rewards=groups * size, sum=float(ones))


def test_no_mean_until_a_window_of_groups_finished_after_the_baseline() -> None:
    w = RewardWindow(window=4)
    assert w.update(totals(10, 20)) is None  # the baseline: earlier groups do not count
    assert w.update(totals(13, 26)) is None  # 3 groups since
    assert w.update(totals(14, 24)) == pytest.approx(4 / 8)  # 4 groups, 4 of 8 samples


def test_the_window_slides_to_the_newest_full_span() -> None:
    w = RewardWindow(window=4)
    for t in (totals(0, 0), totals(4, 0), totals(8, 8)):
        w.update(t)
    assert w.update(totals(10, 10)) == pytest.approx(10 / 12)  # since the mark at 4 groups
    assert w.update(totals(12, 12)) == pytest.approx(4 / 8)  # since the mark at 8 groups


def test_totals_going_backwards_restart_the_window() -> None:
    w = RewardWindow(window=2)
    w.update(totals(0, 0))
    assert w.update(totals(4, 0)) == 0.0
    assert w.update(totals(1, 2)) is None  # Redis was emptied: a new baseline


def test_totals_read_from_the_redis_hash() -> None:
    t = FinishedTotals.from_hash({b"groups": b"3", b"rewards": b"24", b"sum": b"17.5"})
    assert (t.groups, t.rewards, t.sum) == (3, 24, 17.5)
    assert FinishedTotals.from_hash({}) == FinishedTotals()


@pytest.mark.parametrize(("target", "ones", "met"), [(0.8, 13, True), (0.8, 12, False),
                                                     (0.0, 16, False), (None, 16, False)])
def test_target_is_met_at_or_above_it_and_zero_means_none(target: float | None, ones: int,
                                                          met: bool) -> None:
    stop = TargetStop(target, window=8)
    assert stop.feed(totals(0, 0)) is None and not stop.met  # the baseline
    assert stop.feed(totals(8, ones)) == pytest.approx(ones / 16)
    assert stop.met is met
    if met:
        assert "0.812 >= target_reward 0.8 (step 7)" in stop.finish(step=7)
        assert stop.finished == "target reward 0.8 reached at step 7"
    else:
        assert stop.finished == ""


def test_drain_trains_until_nothing_is_in_flight_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gspo_rl.learner.runtime.target, "SETTLE_S", 0.0)
    left = [3]
    reads: list[int] = []

    def in_flight() -> int:
        reads.append(left[0])
        return left[0]

    def train_step() -> None:
        left[0] = max(0, left[0] - 2)

    assert drain(in_flight, train_step, lambda: False, timeout_s=60)
    assert reads == [3, 1, 0, 0]  # two steps, then zero twice


def test_drain_gives_up_when_stopping_or_out_of_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gspo_rl.learner.runtime.target, "SETTLE_S", 0.0)
    steps: list[int] = []
    assert not drain(lambda: 5, lambda: steps.append(1), lambda: len(steps) >= 3,
                     timeout_s=60)
    assert len(steps) == 3  # a stop request (or max_steps) ends it
    assert not drain(lambda: 5, lambda: None, lambda: False, timeout_s=0.0)
