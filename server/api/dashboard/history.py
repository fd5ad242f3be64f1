"""Rates the dashboard measures itself: the learner's pace, throughput, the recent sampled
reward. Redis holds totals only (steps, groups and tokens since the queue began); each read of
``GET /v1/dashboard/state`` adds one sample of them (at most one a second), and a rate is the
difference between the newest sample and the oldest one within ``WINDOW_S``. So rates exist
only while someone watches, from ``MIN_SPAN_S`` after the first read, and a learner that
stops stepping shows its pace falling to 0 over the window. Totals that go backwards (Redis
emptied, a new run) restart the window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gspo_rl.server.api.dashboard.protocol import Rates

WINDOW_S = 300.0
MIN_SPAN_S = 10.0
MIN_EVERY_S = 1.0


@dataclass(frozen=True)
class Sample:
    """Totals at one moment (``t``: this server's monotonic clock)."""

    t: float
    step: int
    groups_generated: int
    tokens_generated: int
    groups_trained: int
    tokens_trained: int
    finished_rewards: int
    finished_sum: float

    def behind(self, other: Sample) -> bool:
        """Whether any total of ``other`` is below this one's (they cannot both be right)."""
        return (other.step < self.step or other.groups_generated < self.groups_generated
                or other.finished_rewards < self.finished_rewards)


class History:
    """The samples of the last ``WINDOW_S`` seconds, and the rates between them."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.samples: deque[Sample] = deque(maxlen=int(window_s / MIN_EVERY_S) + 2)

    def add(self, sample: Sample) -> None:
        if self.samples and self.samples[-1].behind(sample):
            self.samples.clear()
        if self.samples and sample.t - self.samples[-1].t < MIN_EVERY_S:
            self.samples[-1] = sample  # the newest totals, without a denser history
        else:
            self.samples.append(sample)
        while self.samples and sample.t - self.samples[0].t > self.window_s:
            self.samples.popleft()

    def _span(self) -> tuple[Sample, Sample, float] | None:
        if len(self.samples) < 2:
            return None
        first, last = self.samples[0], self.samples[-1]
        dt = last.t - first.t
        return (first, last, dt) if dt >= MIN_SPAN_S else None

    def rates(self) -> Rates:
        span = self._span()
        if span is None:
            return Rates(window_s=0.0)
        a, b, dt = span
        return Rates(window_s=round(dt, 1),
                     tokens_generated_per_s=(b.tokens_generated - a.tokens_generated) / dt,
                     tokens_trained_per_s=(b.tokens_trained - a.tokens_trained) / dt,
                     groups_generated_per_min=60 * (b.groups_generated - a.groups_generated) / dt,
                     groups_trained_per_min=60 * (b.groups_trained - a.groups_trained) / dt)

    def pace_steps_per_min(self) -> float | None:
        span = self._span()
        return None if span is None else 60 * (span[1].step - span[0].step) / span[2]

    def recent_sampled_mean(self) -> float | None:
        """Mean reward per sample of the groups that finished within the window."""
        span = self._span()
        if span is None:
            return None
        a, b, _ = span
        n = b.finished_rewards - a.finished_rewards
        return (b.finished_sum - a.finished_sum) / n if n > 0 else None
