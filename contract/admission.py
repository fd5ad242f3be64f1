"""The admission rule shared by the learner (which publishes its parameters) and the servers
(which hold new groups back): how many groups may be in flight so that none arrives staler
than the learner accepts.

A group is *in flight* from its admission (a request that starts a group was let through)
until the learner trains it or it leaves otherwise (dropped for equal rewards, expired, the
request failed). The learner trains ``groups_per_step`` (G) groups per policy version and
drops groups older than ``max_staleness`` (S) versions. Groups reach it in about the order they
were admitted, so a group admitted while ``n`` others are in flight (the learner's current
batch included) is trained ``ceil((n + 1) / G) - 1`` versions after the current one. Its
oldest token carries the server's version, which trails the learner's by ``lag`` while a
push is on its way (or between pushes with ``sync_every`` > 1). So it is trained within the
bound exactly when::

    n + 1 <= (S + 1 - lag) * G          (AReaL's bounded in-flight rule, with the lag)

``capacity`` is the right-hand side; ``None`` when the learner keeps everything
(``max_staleness`` unset). With no learner published yet, servers use the capacity the
learner's parameters would give at lag 0 if known, else their own fallback.

The learner publishes, in ``Keys.learner_state`` (a hash, next to ``version`` and ``step``):
``max_staleness`` (-1: none), ``groups_per_step``, ``training`` (groups of the batch it is
training now, 0 between steps) and ``finished`` (empty while it trains; once it has met its
goal, e.g. a target reward (``gspo_rl.learner.target``), why it stops: servers then start no new
group, 503 ``training_finished``, until a learner publishes an empty ``finished`` again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

FIELD_VERSION = "version"
FIELD_MAX_STALENESS = "max_staleness"
FIELD_GROUPS_PER_STEP = "groups_per_step"
FIELD_TRAINING = "training"
FIELD_FINISHED = "finished"


def capacity(max_staleness: int | None, groups_per_step: int, lag: int = 0) -> int | None:
    """Most groups in flight such that the newest is trained within ``max_staleness``
    versions; ``None``: no bound. ``lag``: learner version minus the sampling server's."""
    if max_staleness is None or max_staleness < 0:
        return None
    return max(0, (max_staleness + 1 - max(0, lag)) * max(1, groups_per_step))


def admits(in_flight: int, bound: int | None) -> bool:
    """Whether one more group may start while ``in_flight`` are in flight."""
    return bound is None or in_flight + 1 <= bound


@dataclass(frozen=True)
class LearnerParams:
    """What the learner published: its version and admission parameters (None: unknown,
    i.e. no learner has published them yet)."""

    version: int = 0
    max_staleness: int | None = None
    groups_per_step: int | None = None
    training: int = 0
    finished: str = ""
    """Why the learner stopped taking groups (its goal was met); empty: it takes them."""

    @property
    def known(self) -> bool:
        return self.groups_per_step is not None

    @classmethod
    def from_hash(cls, raw: Mapping[bytes | str, bytes | str]) -> LearnerParams:
        """From ``HGETALL Keys.learner_state`` (bytes or str; missing fields: unknown)."""
        d = {(k.decode() if isinstance(k, bytes) else k):
             (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()}

        def num(name: str) -> int | None:
            try:
                return int(float(d[name]))
            except (KeyError, ValueError):
                return None

        stale = num(FIELD_MAX_STALENESS)
        return cls(version=num(FIELD_VERSION) or 0,
                   max_staleness=None if stale is None or stale < 0 else stale,
                   groups_per_step=num(FIELD_GROUPS_PER_STEP),
                   training=max(0, num(FIELD_TRAINING) or 0),
                   finished=d.get(FIELD_FINISHED, ""))

    def bound(self, server_version: int, fallback: int | None) -> int | None:
        """The capacity for a server at ``server_version``; ``fallback`` while no learner has
        published its parameters."""
        if not self.known:
            return fallback
        assert self.groups_per_step is not None
        return capacity(self.max_staleness, self.groups_per_step,
                        self.version - server_version)
