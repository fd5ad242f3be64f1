"""What the learner publishes to Redis for the rest of the system (``Keys.learner_state``):
its policy version and step, groups trained, and the admission parameters the rollout servers
bound the groups in flight with (``gspo_rl.contract.admission``): ``max_staleness`` (-1: none),
``groups_per_step``, ``training`` (groups of the step being trained, 0 between steps) and
``finished`` (why it stopped taking groups, ``gspo_rl.learner.runtime.target``; empty while it
trains); the reward of what it trained (``TrainedRewards``: the mean reward per sample of its
last step's groups and of its last ``RECENT_STEPS`` steps', absent before its first step); and
its heartbeat, ``seen_at`` (Redis time of its latest read of the queue: ``beat``). After each
step, each trained rollout's per-token log importance ratios (``publish_token_ratios``:
``Keys.token_ratios``, one pipeline, kept ``ratios_ttl_s``). A Redis error is logged, never
raised: the next step publishes again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import redis

from gspo_rl.contract.admission import (
    FIELD_FINISHED,
    FIELD_GROUPS_PER_STEP,
    FIELD_MAX_STALENESS,
    FIELD_SEEN_AT,
    FIELD_TRAINING,
    FIELD_VERSION,
)
from gspo_rl.contract.ratios import pack_log_ratios
from gspo_rl.contract.schema import (
    REWARD_TRAINED,
    REWARD_TRAINED_RECENT,
    REWARD_TRAINED_STEPS,
    Keys,
    ReadyGroup,
)
from gspo_rl.learner.config import LearnerConfig

log = logging.getLogger("gspo_rl.learner.loop")
RECENT_STEPS = 20


class TrainedRewards:
    """The rewards of the groups each step trained, over the last ``steps`` steps: the mean
    per sample of the last step's (``reward_trained`` of its step record) and of them all."""

    def __init__(self, steps: int = RECENT_STEPS) -> None:
        self._steps: deque[tuple[float, int]] = deque(maxlen=steps)  # (sum, samples)

    def add(self, groups: Sequence[ReadyGroup]) -> None:
        """A step trained ``groups``."""
        rewards = [float(r) for g in groups for r in g.rewards]
        if rewards:
            self._steps.append((sum(rewards), len(rewards)))

    def fields(self) -> dict[str, Any]:
        """The state hash's fields ({} before the first step)."""
        if not self._steps:
            return {}
        last, n_last = self._steps[-1]
        total, n = sum(s for s, _ in self._steps), sum(k for _, k in self._steps)
        return {REWARD_TRAINED: repr(last / n_last), REWARD_TRAINED_RECENT: repr(total / n),
                REWARD_TRAINED_STEPS: len(self._steps)}


def state_fields(config: LearnerConfig, version: int, step: int, groups_trained: int,
                 training: int = 0, finished: str = "", tokens_trained: int = 0,
                 rewards: TrainedRewards | None = None) -> dict[str, Any]:
    stale = config.max_staleness
    return {FIELD_VERSION: version, "step": step, "updated_at": time.time(),
            "consumer": config.consumer, "groups_trained": groups_trained,
            "tokens_trained": tokens_trained,
            FIELD_MAX_STALENESS: -1 if stale is None else stale,
            FIELD_GROUPS_PER_STEP: config.groups_per_step, FIELD_TRAINING: training,
            FIELD_FINISHED: finished, **(rewards.fields() if rewards is not None else {})}


def publish_state(client: redis.Redis, keys: Keys, fields: dict[str, Any]) -> None:
    """HSET the fields; a Redis error is logged, not raised (the next step publishes again)."""
    try:
        client.hset(keys.learner_state, mapping=fields)  # type: ignore[arg-type]  # redis-py's key type (invariant) refuses dict[str, ...]
    except redis.RedisError as exc:
        log.warning("publishing the learner state failed: %s", exc)


def ratios_ttl_s(config: LearnerConfig) -> int:
    """How long a rollout's ratios stay: as long as its records, which the trim keeps
    ``keep_trained_s`` after the ack (at the next checkpoint: up to ``save_every_s`` after the
    step with a ``save_dir``). 0: none written (records deleted with their entry)."""
    if config.keep_trained_s <= 0:
        return 0
    wait = config.save_every_s if config.save_dir is not None and config.save_every_s else 0.0
    return config.keep_trained_s + int(math.ceil(wait))


def publish_token_ratios(client: redis.Redis, keys: Keys, ratios: Mapping[str, np.ndarray],
                         ttl_s: int) -> None:
    """SET each rollout's log-ratios (``gspo_rl.contract.ratios``) with a TTL of ``ttl_s``, in
    one pipeline; nothing when there are none or ``ttl_s`` is 0."""
    if not ratios or ttl_s <= 0:
        return
    try:
        with client.pipeline(transaction=False) as pipe:
            for rid, values in ratios.items():
                pipe.set(keys.token_ratios(rid), pack_log_ratios(values), ex=ttl_s)
            pipe.execute()
    except redis.RedisError as exc:
        log.warning("publishing the importance ratios of %d rollouts failed: %s",
                    len(ratios), exc)


def publish_training(client: redis.Redis, keys: Keys, n_groups: int) -> None:
    """The step now being trained holds ``n_groups`` groups (still in flight for admission)."""
    publish_state(client, keys, {FIELD_TRAINING: n_groups})


BEAT = "redis.call('HSET', KEYS[1], ARGV[1], redis.call('TIME')[1]) return 1"
BEAT_EVERY_S = 2.0


class Heartbeat:
    """``seen_at`` in the learner's state, in Redis time, every ``BEAT_EVERY_S`` from a
    daemon thread while the learner runs (a long step included); servers tell environments
    "no learner is connected" once it is ``LEARNER_GONE_S`` old. ``stop`` ends it."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.keys = client, keys
        self._script = client.register_script(BEAT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gspo-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()
        return self

    def stop(self) -> None:
        """No beat after this returns."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._script(keys=[self.keys.learner_state], args=[FIELD_SEEN_AT])
            except redis.RedisError as exc:  # the loop says so loudly if Redis is gone
                log.debug("heartbeat not written: %s", exc)
            self._stop.wait(BEAT_EVERY_S)
