"""``/v1/groups`` below HTTP: open a group of multi-turn episodes, read a group (with each
rollout's trajectory on request), give a group up.

Refusals are the rollout layer's: 404 ``unknown_group`` (never created, or its records
expired), 501 ``tokens_unsupported`` (an app with no tokenizer cannot decode trajectories),
501 ``groups_unsupported`` (an app that serves only the queue opens no groups) and the
size bound of ``check_group_size`` (422).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gspo_rl.redisq.groups.store import GroupView, RolloutStore
from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.sampler import SamplingEngine
from gspo_rl.server.metrics import ServerMetrics
from gspo_rl.server.rollouts.episodes import open_episode_group
from gspo_rl.server.rollouts.errors import RolloutError, not_found, unsupported
from gspo_rl.server.rollouts.limits import check_group_size
from gspo_rl.server.rollouts.protocol.groups import (
    AbandonOut,
    GroupOut,
    GroupRolloutOut,
    OpenGroupIn,
    OpenGroupOut,
)
from gspo_rl.server.rollouts.trajectory import TrajectoryOut, load_trajectories


def _unknown(group_id: str) -> RolloutError:
    return not_found(f"unknown group {group_id!r} (never created, or expired)",
                     code="unknown_group")


@dataclass(frozen=True)
class GroupServing:
    """One per app (``app.state.serving_groups``). ``settings`` and ``metrics`` None: an app
    that serves only the queue (it opens no groups); ``tokenizer`` None: it decodes no
    trajectories; ``engine``: the policy version a new group's episodes start at."""

    store: RolloutStore
    settings: ServerSettings | None = None
    metrics: ServerMetrics | None = None
    tokenizer: Any | None = None
    engine: SamplingEngine | None = None

    async def open(self, body: OpenGroupIn) -> OpenGroupOut:
        """Opens ``body.size`` empty episodes as one group, recorded before it returns."""
        if self.settings is None or self.metrics is None:
            raise unsupported("this server opens no groups", code="groups_unsupported")
        check_group_size(body.size, self.settings.queue.max_group_size)
        group_id, rollout_ids = await open_episode_group(self.store, body.size, body.metadata,
                                                         self.settings.server_id)
        self.metrics.groups.inc()
        self.metrics.rollouts.inc(len(rollout_ids))
        version = self.engine.policy_version if self.engine is not None else None
        return OpenGroupOut(group_id=group_id, rollout_ids=rollout_ids, policy_version=version)

    async def abandon(self, group_id: str) -> AbandonOut:
        """Ends an open group now, as its deadline would; idempotent."""
        state = await self.store.abandon_group(group_id)
        if state is None:
            raise _unknown(group_id)
        return AbandonOut(group_id=group_id, state=state)

    async def get(self, group_id: str, with_tokens: bool = False) -> GroupOut:
        """A group's state; ``with_tokens``: each rollout's trajectory too (the field is set
        only then)."""
        g = await self.store.get_group(group_id)
        if g is None:
            raise _unknown(group_id)
        trajectories: dict[str, TrajectoryOut | None] = {}
        if with_tokens:  # the tokenizer only then: a queue-only app has none
            if self.tokenizer is None:
                raise unsupported("this server has no tokenizer to decode trajectories",
                                  code="tokens_unsupported")
            trajectories = await load_trajectories(self.store, self.tokenizer, group_id,
                                                   g.rollout_ids, g.stream_id)
        return _group_out(g, trajectories if with_tokens else None)


def _group_out(g: GroupView, trajectories: dict[str, TrajectoryOut | None] | None) -> GroupOut:
    rollouts = []
    for rid in g.rollout_ids:
        rw = g.rewards.get(rid)
        extra = {"trajectory": trajectories.get(rid)} if trajectories is not None else {}
        rollouts.append(GroupRolloutOut(
            rollout_id=rid, rewarded=rw is not None,
            reward=None if rw is None else rw["reward"],
            turn_rewards=None if rw is None else rw["turn_rewards"], **extra))
    return GroupOut(
        group_id=g.group_id, state=g.state, size=g.size,
        n_rollouts=len(g.rollout_ids), n_rewarded=g.n_rewarded, created_at=g.created_at,
        deadline=g.deadline, partial=g.partial, stream_id=g.stream_id,
        drop_reason=g.drop_reason, metadata=g.metadata, rollouts=rollouts)
