"""What the learner publishes to Redis for the rest of the system (``Keys.learner_state``):
its policy version and step, groups trained, and the admission parameters the rollout servers
bound the groups in flight with (``gspo_rl.contract.admission``): ``max_staleness`` (-1: none),
``groups_per_step``, ``training`` (groups of the step being trained, 0 between steps) and
``finished`` (why it stopped taking groups, ``gspo_rl.learner.target``; empty while it trains).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from gspo_rl.contract.admission import (
    FIELD_FINISHED,
    FIELD_GROUPS_PER_STEP,
    FIELD_MAX_STALENESS,
    FIELD_TRAINING,
    FIELD_VERSION,
)
from gspo_rl.contract.queue.schema import Keys
from gspo_rl.learner.config import LearnerConfig

log = logging.getLogger("gspo_rl.learner.loop")


def state_fields(config: LearnerConfig, version: int, step: int, groups_trained: int,
                 training: int = 0, finished: str = "",
                 tokens_trained: int = 0) -> dict[str, Any]:
    stale = config.max_staleness
    return {FIELD_VERSION: version, "step": step, "updated_at": time.time(),
            "consumer": config.consumer, "groups_trained": groups_trained,
            "tokens_trained": tokens_trained,
            FIELD_MAX_STALENESS: -1 if stale is None else stale,
            FIELD_GROUPS_PER_STEP: config.groups_per_step, FIELD_TRAINING: training,
            FIELD_FINISHED: finished}


def publish_state(client: redis.Redis, keys: Keys, fields: dict[str, Any]) -> None:
    """HSET the fields; a Redis error is logged, not raised (the next step publishes again)."""
    try:
        client.hset(keys.learner_state, mapping=fields)
    except redis.RedisError as exc:
        log.warning("publishing the learner state failed: %s", exc)


def publish_training(client: redis.Redis, keys: Keys, n_groups: int) -> None:
    """The step now being trained holds ``n_groups`` groups (still in flight for admission)."""
    publish_state(client, keys, {FIELD_TRAINING: n_groups})
