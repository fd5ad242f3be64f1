"""How far a group's sampling weights are from the weights that will train it, across restarts.

Policy versions stay monotonic across learner restarts: a learner that resumes from the
checkpoint of version ``base`` while ``published`` was already announced labels its weights
(the checkpoint's) ``start = published + 1``. Versions ``base + 1 .. published`` then name
weights that no crash survived: a branch that was lost. Counting staleness as
``current - sampled`` would call the groups redelivered from before the crash ``start - base``
versions older than they are, and drop them although the weights now trained are the ones
they were sampled from (or a few updates apart).

A ``Lineage`` is the list of such gaps ``(base, start)``, oldest first. ``staleness(current,
sampled)`` is the number of updates between the two weights along the lineage: back from
``current`` to the newest gap's ``start`` (its weights are ``base``'s), on to ``sampled``; a
version on a lost branch (``base < sampled < start``) is ``sampled - base`` updates off the
branch point. Without gaps it is ``current - sampled``. Why: docs/concepts/staleness.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Lineage:
    """The resumes (``(base, start)``: weights of ``base`` labelled ``start``), oldest first."""

    gaps: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def from_json(cls, raw: Iterable[Iterable[int]] | None) -> Lineage:
        """From a checkpoint's ``[[base, start], ...]`` (missing or malformed: none)."""
        gaps: list[tuple[int, int]] = []
        for pair in raw or []:
            base, start = (int(x) for x in pair)
            if 0 <= base < start:
                gaps.append((base, start))
        return cls(sorted(gaps, key=lambda g: g[1]))

    def to_json(self) -> list[list[int]]:
        return [[b, s] for b, s in self.gaps]

    def resumed(self, base: int, start: int) -> None:
        """The weights of version ``base`` are labelled ``start`` from now on."""
        if start > base:
            self.gaps.append((base, start))

    def forget_before(self, current: int, horizon: int) -> None:
        """Drop gaps older than ``horizon`` updates: any group from before one is at least
        that stale whichever way it is counted."""
        self.gaps = [(b, s) for b, s in self.gaps if current - s <= horizon]

    def staleness(self, current: int, sampled: int) -> int:
        """Updates between the weights ``sampled`` and the weights ``current``."""
        distance, cur = 0, current
        for base, start in reversed(self.gaps):
            if sampled >= start:
                break
            distance += cur - start
            cur = base
            if sampled > base:  # sampled on the lost branch after ``base``
                return distance + (sampled - base)
        return distance + (cur - sampled)
