"""Say so when most recent groups carry no learning signal, and why.

A group whose samples all earn the same reward teaches nothing (every advantage is 0: the
server drops it). When most of an environment's recent groups end so, sampling is spent for
nothing, and the cause is one of two: the policy solves every sample of most tasks (the task
is learned, or too easy) or fails every sample (too hard). ``SignalWatch`` counts, over the
last ``window`` groups, those with a signal and those without (solved: every reward at
``solved_reward`` or more; failed: at ``failed_reward`` or less; flat: equal in between), and
says it in one line, at most every ``every_s`` seconds, naming the cause.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence

log = logging.getLogger("gspo_rl.client.environment")
ADVICE = {"solved": "the policy solves every sample of most tasks: give it harder ones, or "
                    "stop (the task is learned; --target-reward)",
          "failed": "the policy fails every sample of most tasks: give it easier ones (a "
                    "curriculum, a supervised warm start: docs/sft.md) or more samples per "
                    "task (--group-size)",
          "flat": "every sample of most tasks earns the same reward: the reward does not "
                  "tell the samples apart (partial credit, a finer verifier)"}


def kind_of(rewards: Sequence[float], solved_reward: float = 1.0,
            failed_reward: float = 0.0) -> str:
    """"signal" when the rewards differ, else solved / failed / flat. Pure."""
    if not rewards or max(rewards) != min(rewards):
        return "signal"
    if rewards[0] >= solved_reward:
        return "solved"
    return "failed" if rewards[0] <= failed_reward else "flat"


class SignalWatch:
    """Counts the last ``window`` groups by kind; warns when ``share`` or more had no signal
    (module docstring)."""

    def __init__(self, window: int = 32, share: float = 0.5, every_s: float = 60.0,
                 say: Callable[[str], None] = log.warning) -> None:
        self.recent: deque[str] = deque(maxlen=window)
        self.share, self.every_s, self.say = share, every_s, say
        self.said_at: float | None = None

    def on_group(self, rewards: Sequence[float]) -> str | None:
        """Count one finished group; the line said, if it was time to say one."""
        self.recent.append(kind_of(rewards))
        line = self.line()
        if line is None or (self.said_at is not None
                            and time.monotonic() - self.said_at < self.every_s):
            return None
        self.said_at = time.monotonic()
        self.say(line)
        return line

    def line(self) -> str | None:
        """The warning, or None while enough recent groups carry a signal."""
        if len(self.recent) < (self.recent.maxlen or 0):
            return None
        counts = Counter(self.recent)
        without = len(self.recent) - counts["signal"]
        if without < self.share * len(self.recent):
            return None
        cause = max(ADVICE, key=lambda k: counts[k])
        parts = ", ".join(f"{counts[k]} {k} by every sample" if k != "flat" else
                          f"{counts[k]} with equal rewards in between" for k in ADVICE
                          if counts[k])
        return (f"{without} of the last {len(self.recent)} groups carried no learning signal "
                f"({parts}); {ADVICE[cause]}. Such groups are dropped and cost their "
                "sampling: the server slows new ones (no_signal_hold_s), and to a probe "
                "when none has carried a signal for 3 minutes (no_signal_drought_s)")
