"""The admission rule shared by the learner (which publishes its parameters) and the servers
(which hold new groups back): how many groups may be in flight so that none arrives staler
than the learner accepts.

A group is *in flight* from its admission until the learner trains it or it leaves otherwise
(dropped, expired, the request failed). With ``groups_per_step`` G, ``max_staleness`` S and
``lag`` (how many versions the server trails the learner), a group admitted while ``n`` others
are in flight is trained within the bound exactly when ``n + 1 <= (S + 1 - lag) * G``
(AReaL's bounded in-flight rule, with the lag). ``capacity`` is the right-hand side; ``None``
when the learner keeps everything.

The learner publishes, in ``Keys.learner_state``: ``max_staleness`` (-1: none),
``groups_per_step``, ``training`` (groups of the batch it is training now) and ``finished``
(empty while it trains; else why it stopped: servers then start no new group, 503
``training_finished``) and ``seen_at`` (its heartbeat: Redis time, written every few seconds
by a thread while the learner process runs, a long step included; ``learner_connected``).
The derivation:
docs/design/admission.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

FIELD_VERSION = "version"
FIELD_MAX_STALENESS = "max_staleness"
FIELD_GROUPS_PER_STEP = "groups_per_step"
FIELD_TRAINING = "training"
FIELD_FINISHED = "finished"
FIELD_SEEN_AT = "seen_at"
LEARNER_GONE_S = 30.0
"""A learner whose heartbeat is this old is not connected (it beats every 2 s while its
process runs: ``gspo_rl.learner.runtime.published.Heartbeat``)."""


def learner_connected(age_s: float | None) -> bool:
    """Whether a learner whose heartbeat is ``age_s`` old (None: never) is connected."""
    return age_s is not None and age_s <= LEARNER_GONE_S


def no_learner_text(age_s: float | None) -> str:
    """What to tell a person waiting on a queue no learner reads."""
    when = ("no learner has been seen yet" if age_s is None else
            f"no learner has been seen for {age_s:.0f} s")
    return (f"no learner is connected ({when}): start one (gspo learn), or use "
            "--no-admission to try an environment alone")


def capacity(max_staleness: int | None, groups_per_step: int, lag: int = 0) -> int | None:
    """Most groups in flight such that the newest is trained within ``max_staleness``
    versions; ``None``: no bound. ``lag``: learner version minus the sampling server's."""
    if max_staleness is None or max_staleness < 0:
        return None
    return max(0, (max_staleness + 1 - max(0, lag)) * max(1, groups_per_step))


def budget_counted(no_signal: int, bound: int | None, groups_per_step: int | None,
                   drought: bool = False) -> int:
    """How many of the groups that ended without a learning signal since the learner's last
    step count as in flight (the sampling budget): all of them, but never so many that fewer
    than one step's groups (``groups_per_step``) could be sampled, so a learner waiting for
    the rare group with a signal is never starved (docs/learning-signal.md). In a
    ``drought`` (no group has carried a signal for ``no_signal_drought_s`` while groups kept
    ending without one: ``in_drought``) all of them count: the policy cannot change while
    nothing trains, and the environment slows to ``bound / no_signal_hold_s`` groups a
    second until one group carries a signal."""
    if bound is None or not groups_per_step or drought:
        return no_signal
    return min(no_signal, max(0, bound - groups_per_step))


def in_drought(no_signal_recent: int, groups_per_step: int | None) -> bool:
    """Whether ``no_signal_recent`` groups without a signal, ended within the drought window
    while none with a signal did (``gspo_rl.redisq.inflight``: 0 outside a drought), make a
    drought: at least one learner step's worth of them."""
    return no_signal_recent > 0 and no_signal_recent >= max(1, groups_per_step or 1)


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
    seen_at: float | None = None
    """Redis time of the learner's last read of the queue (None: never)."""

    @property
    def known(self) -> bool:
        return self.groups_per_step is not None

    @classmethod
    def from_hash(cls, raw: Mapping[bytes, bytes] | Mapping[str, str]
                  | Mapping[bytes | str, bytes | str]) -> LearnerParams:
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
                   finished=d.get(FIELD_FINISHED, ""), seen_at=_float(d.get(FIELD_SEEN_AT)))

    def bound(self, server_version: int, fallback: int | None) -> int | None:
        """The capacity for a server at ``server_version``; ``fallback`` while no learner has
        published its parameters."""
        if not self.known:
            return fallback
        assert self.groups_per_step is not None
        return capacity(self.max_staleness, self.groups_per_step,
                        self.version - server_version)


def _float(raw: str | None) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None
