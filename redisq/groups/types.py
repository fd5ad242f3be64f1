"""The store's configuration and the values its operations take and return
(``gspo_rl.redisq.groups.store``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgpack
from pydantic import BaseModel, ConfigDict, Field

from gspo_rl.contract.credit import AdvantageConfig


class QueueConfig(BaseModel):
    """How long groups wait for rewards and what happens to groups that cannot be trained."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    group_ttl_s: float = Field(default=600.0, gt=0)
    """Seconds after its creation a group that is not complete expires."""
    group_idle_s: float = Field(default=120.0, gt=0)
    """An open group with no activity (created, a turn recorded, a reward stored) for this long
    stops counting as in flight for admission (``gspo_rl.redisq.inflight``), although
    it stays open until its deadline: a group its environment or its server lost holds
    admission capacity this long at most, not ``group_ttl_s``."""
    min_rewarded_to_finalise: int = Field(default=2, ge=1)
    """At expiry, a group with at least this many rewarded rollouts is published with them
    (partial); one with fewer is dropped (counted as ``groups_expired_dropped``)."""
    drop_zero_variance: bool = True
    """Drop groups without learning signal: every advantage of the credit rule is 0 (final
    rewards all equal, and so are the turn rewards of every turn index)."""
    rollout_ttl_s: float = Field(default=3600.0, gt=0)
    """Lifetime of a rollout record from its last write while its group is open, never less
    than the group's own keys: ``max(rollout_ttl_s, group_ttl_s + finished_ttl_s + 1)``."""
    finished_ttl_s: float = Field(default=600.0, gt=0)
    """How long a published / dropped / expired group's keys and rollouts stay, so that a
    repeated reward gets a 200, a late one a 410, and ``GET /v1/groups/{id}`` its state."""
    dropped_records_ttl_s: float = Field(default=60.0, ge=0)
    """How long the token records of rollouts that were not published stay after their group
    ended (a dropped or expired group's, and a partial group's unrewarded ones), at most
    ``finished_ttl_s``: the dashboard's rollout browser shows them this long. The group's
    tombstone (its state, rewards and rollout ids, which answer a late or repeated reward)
    stays ``finished_ttl_s``. 0 deletes them when the group ends."""
    stuck_complete_s: float = Field(default=5.0, ge=0)
    """The sweeper publishes a group left ``complete`` this long (its finisher died)."""
    sweep_limit: int = Field(default=500, ge=1)
    """Due groups handled per sweep pass (bounds the time one script blocks Redis)."""
    max_group_size: int = Field(default=4096, ge=1)
    """Largest accepted group."""
    advantage_eps: float = Field(default=AdvantageConfig.eps, gt=0)
    """``eps`` of the credit rule (``gspo_rl.contract.credit.group_credit``): c / (sigma + eps)."""
    scale_advantages: bool = AdvantageConfig.scale
    """Divide by the group's spread (False: only centre, Dr. GRPO style)."""

    @property
    def advantage(self) -> AdvantageConfig:
        """The credit rule's config, recorded with each published group."""
        return AdvantageConfig(eps=self.advantage_eps, scale=self.scale_advantages)


@dataclass(frozen=True)
class RewardItem:
    rollout_id: str
    reward: float
    turn_rewards: list[float] | None = None
    n_turns: int | None = None  # the rollout's model turns, when the store knows them


@dataclass
class RewardResult:
    """One item's outcome. ``status``: stored | duplicate | unknown_rollout | conflict |
    expired | closed | not_applied (valid, but another item of the call failed)."""

    rollout_id: str
    status: str
    group_id: str | None = None
    group_complete: bool = False

    @property
    def ok(self) -> bool:
        return self.status in ("stored", "duplicate")


@dataclass
class RewardsOutcome:
    results: list[RewardResult]
    applied: bool  # False: at least one item failed and nothing of the call was written


@dataclass
class GroupView:
    group_id: str
    state: str
    size: int
    n_rewarded: int
    created_at: float
    deadline: float
    metadata: dict[str, Any]
    rollout_ids: list[str]
    rewards: dict[str, dict[str, Any]]  # rollout_id -> {"reward", "turn_rewards"}
    partial: bool
    stream_id: str | None
    drop_reason: str | None


def pack_reward(reward: float, turn_rewards: Sequence[float] | None,
                n_turns: int | None = None) -> bytes:
    """Canonical bytes for a reward, compared byte for byte by the reward script (so a repeat
    with equal values is a duplicate). ``+ 0.0`` folds -0.0 into 0.0. ``n_turns`` (the
    rollout's model turns; fixed once it is rewarded) lets the credit rule place an episode
    without turn rewards among the others' turns
    (``gspo_rl.redisq.groups.finish.reward_turns``)."""
    turns = None if turn_rewards is None else [float(t) + 0.0 for t in turn_rewards]
    return cast(bytes, msgpack.packb({"reward": float(reward) + 0.0,  # (untyped msgpack)
                                      "turn_rewards": turns, "n_turns": n_turns}))


def pack_rewards(items: Sequence[RewardItem]) -> tuple[dict[str, bytes], set[str]]:
    """Each rollout's ``pack_reward`` bytes (one per rollout id, in order of first mention)
    and the ids given two different rewards in the same call (the call is then refused)."""
    packed: dict[str, bytes] = {}
    conflicts: set[str] = set()
    for it in items:
        p = pack_reward(it.reward, it.turn_rewards, it.n_turns)
        if packed.setdefault(it.rollout_id, p) != p:
            conflicts.add(it.rollout_id)
    return packed, conflicts
