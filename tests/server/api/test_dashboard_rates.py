"""The dashboard's own arithmetic, without a server or a browser: rates between the totals it
sampled (``gspo_rl.server.api.dashboard.history``) and the learner's last stall as published in
its state hash (``gspo_rl.contract.stall``, written by ``ProgressMonitor``)."""

from __future__ import annotations

from typing import Any

import pytest

from gspo_rl.contract.stall import LastStall
from gspo_rl.learner.runtime.progress import ProgressMonitor
from gspo_rl.learner.tracking.metrics import MetricsLogger
from gspo_rl.server.api.dashboard.history import MIN_SPAN_S, History, Sample


def sample(t: float, step: int, tokens: int = 0, rewards: int = 0, total: float = 0.0) -> Sample:
    return Sample(t=t, step=step, groups_generated=step * 4, tokens_generated=tokens,
                  groups_trained=step * 2, tokens_trained=tokens // 2,
                  finished_rewards=rewards, finished_sum=total)


def test_rates_need_a_span_then_follow_the_totals() -> None:
    h = History(window_s=60.0)
    h.add(sample(0.0, 0))
    h.add(sample(MIN_SPAN_S / 2, 1, tokens=50))
    assert h.pace_steps_per_min() is None and h.rates().window_s == 0.0
    h.add(sample(30.0, 6, tokens=3000, rewards=8, total=6.0))
    assert h.pace_steps_per_min() == pytest.approx(12.0)
    rates = h.rates()
    assert rates.tokens_generated_per_s == pytest.approx(100.0)
    assert rates.groups_trained_per_min == pytest.approx(24.0)
    assert h.recent_sampled_mean() == pytest.approx(0.75)
    for t in (50.0, 75.0, 100.0):  # the learner stopped: its pace falls as the window moves
        h.add(sample(t, 6, tokens=3000, rewards=8, total=6.0))
    assert h.pace_steps_per_min() == 0.0 and h.recent_sampled_mean() is None


def test_totals_that_go_backwards_restart_the_window() -> None:
    h = History()
    h.add(sample(0.0, 50))
    h.add(sample(20.0, 60))
    h.add(sample(40.0, 1))  # Redis emptied: a new run
    assert len(h.samples) == 1 and h.pace_steps_per_min() is None


def test_a_stall_is_published_when_warned_and_its_end_too() -> None:
    published: dict[str, Any] = {}
    progress = ProgressMonitor(MetricsLogger(console=False), publish=published.update)
    assert LastStall.from_hash(published) is None
    progress.stalled("all_stale", "3 groups older than 2 versions dropped")
    stall = LastStall.from_hash(published)
    assert stall is not None and stall.reason == "all_stale" and stall.ended_at is None
    assert stall.detail == "3 groups older than 2 versions dropped"
    progress.stalled("all_stale", "again")  # within the warning interval: not published
    assert LastStall.from_hash(published).detail.startswith("3 groups")  # type: ignore[union-attr]
    progress.progressed()
    ended = LastStall.from_hash({k.encode(): str(v).encode() for k, v in published.items()})
    assert ended is not None and ended.ended_at is not None and ended.ended_at >= stall.at
