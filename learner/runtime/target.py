"""Stopping at a target reward: when the environment's recent groups score high enough, the
task is learned, and sampling more of it is waste (whole groups score alike, carry no signal
and are dropped; measured: docs/design/learner-loop.md).

What is measured is what the environment scored, not what the learner trained: the mean
reward of every group that finished with rewards (published, or dropped for equal rewards),
from the totals the servers keep in ``Keys.finished_rewards``, over the last ``window`` groups
that finished since this learner started (``RewardWindow``; the same measure as ``gspo up``'s
``--target-reward``, which reads it on the environment's side).

When it reaches the target, the learner (``gspo_rl.learner.loop``) publishes ``finished`` in its
state: the servers start no new group (503 ``training_finished``,
``gspo_rl.server.rollouts.admission``); it trains the groups still in flight (``groups_in_flight``,
at most ``drain_timeout_s``), checkpoints, logs why it stopped and how to go on, and returns (``gspo
learn`` exits 0). A learner started again publishes an empty ``finished``: the servers take groups
again.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis

from gspo_rl.contract.schema import Keys, as_str
from gspo_rl.redisq.inflight import IN_FLIGHT_FACTS, InFlightFacts, in_flight_call


@dataclass(frozen=True)
class FinishedTotals:
    """Totals over every group that finished with rewards (``Keys.finished_rewards``)."""

    groups: int = 0
    rewards: int = 0
    sum: float = 0.0

    @classmethod
    def from_hash(cls, raw: Mapping[bytes, bytes] | Mapping[bytes | str, bytes | str]
                  ) -> FinishedTotals:
        d = {as_str(k): as_str(v) for k, v in raw.items()}
        return cls(groups=int(d.get("groups", 0)), rewards=int(d.get("rewards", 0)),
                   sum=float(d.get("sum", 0.0)))


def read_totals(client: redis.Redis, keys: Keys) -> FinishedTotals:
    return FinishedTotals.from_hash(client.hgetall(keys.finished_rewards))


class RewardWindow:
    """The mean reward of the last (at least) ``window`` finished groups, from totals read
    now and then (after each step). Pure: fed ``FinishedTotals``; the first one fed is the
    baseline (groups that finished before it do not count)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.marks: deque[FinishedTotals] = deque()

    def update(self, now: FinishedTotals) -> float | None:
        """Adds a reading; returns the mean reward per sample over the newest span of at least
        ``window`` groups, or None while fewer than ``window`` groups finished since the
        baseline (or while the totals went backwards: Redis was emptied; restarts the window)."""
        if self.marks and now.groups < self.marks[-1].groups:
            self.marks.clear()
        self.marks.append(now)
        start = None
        while self.marks and now.groups - self.marks[0].groups >= self.window:
            start = self.marks.popleft()  # the newest mark still a full window back
        if start is None:
            return None
        self.marks.appendleft(start)
        n = now.rewards - start.rewards
        return (now.sum - start.sum) / n if n > 0 else None


def read_in_flight(client: redis.Redis, keys: Keys) -> InFlightFacts:
    """The in-flight facts (``gspo_rl.redisq.inflight``), read synchronously; its
    ``no_signal``: the groups dropped for equal rewards since the learner's last step."""
    keys_, args = in_flight_call(keys, hold_s=NO_SIGNAL_SINCE_STEP_S)
    return InFlightFacts.from_reply(client.register_script(IN_FLIGHT_FACTS.source)(keys_, args))


def groups_in_flight(client: redis.Redis, keys: Keys) -> int:
    """Groups started and not yet trained or dropped (``gspo_rl.redisq.inflight``'s count;
    the learner's own ``training`` is 0 between its steps): sampling at a server, open (with
    recent activity), complete, or published and not yet read by the learner."""
    f = read_in_flight(client, keys)
    return f.open + f.complete + f.undelivered + f.remote_pending


NO_SIGNAL_SINCE_STEP_S = 3600.0  # the learner reads every no-signal drop since its last step
# > gspo_rl.redisq.inflight.PUBLISH_EVERY_S: a request being sampled shows by then
SETTLE_S = 1.5


def drain(in_flight: Callable[[], int], train_step: Callable[[], None],
          stopping: Callable[[], bool], timeout_s: float) -> bool:
    """Train until no group is in flight (read as zero twice, ``SETTLE_S`` apart: a request
    a server admitted a moment ago shows in its next published count), for at most
    ``timeout_s`` or until ``stopping()``. True: nothing was left in flight."""
    deadline = time.monotonic() + timeout_s
    idle = 0
    while not stopping() and time.monotonic() < deadline:
        idle = idle + 1 if in_flight() == 0 else 0
        if idle >= 2:
            return True
        if idle:
            time.sleep(SETTLE_S)
        else:
            train_step()
    return False


def stop_message(target: float, mean: float, window: int, step: int) -> str:
    """The loud line the learner logs when it reaches its target."""
    return (f"TARGET REWARD REACHED: the environment's mean reward over its last {window} "
            f"groups is {mean:.3f} >= target_reward {target:g} (step {step}). The servers "
            "start no new group now (503 training_finished); training the groups still in "
            "flight, then checkpointing and stopping")


def continue_hint() -> str:
    """How to keep training after a target stop."""
    return ("to keep training, start the learner again with a higher --target-reward, or "
            "--target-reward 0 for none (docker compose: GSPO_TARGET_REWARD in .env, then "
            "`docker compose --profile cpu up`); with --resume it continues from this "
            "checkpoint, and the servers take new groups again as soon as it starts")


class TargetStop:
    """The learner's side of a target stop: the reward window, whether the target is met,
    and why the learner finished (empty until then)."""

    def __init__(self, target: float | None, window: int) -> None:
        self.target = target or None  # 0: none
        self.window = RewardWindow(window)
        self.met = False
        self.finished = ""
        self.last: float | None = None

    def observe(self, client: redis.Redis, keys: Keys) -> float | None:
        """Reads the totals (after a step); returns the window's mean (None: not yet known, or
        Redis did not answer: the next step reads again)."""
        try:
            return self.feed(read_totals(client, keys))
        except redis.RedisError:
            return None

    def feed(self, totals: FinishedTotals) -> float | None:
        """``observe`` without Redis: the window's mean after ``totals``."""
        mean = self.window.update(totals)
        self.last = mean
        if self.target is not None and mean is not None and mean >= self.target:
            self.met = True
        return mean

    def finish(self, step: int) -> str:
        """Marks the learner finished; returns the loud line to log."""
        assert self.target is not None and self.last is not None
        self.finished = f"target reward {self.target:g} reached at step {step}"
        return stop_message(self.target, self.last, self.window.window, step)
