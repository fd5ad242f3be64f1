"""``POST /v1/rewards`` below HTTP: store every reward of a call, or none.

The store checks and writes all items in one Redis script (``RolloutStore.post_rewards``).
When any item fails, nothing is stored and the call is refused as a ``StoreError`` with the
reason of the first failing item in list order (unknown rollout: not found; another reward
already stored: conflict; its group expired or was finalised without it: gone), a message
naming it, and every item's status in ``details["results"]`` (the valid ones
``not_applied``); ``gspo_rl.server.api.errors`` maps the reason to HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gspo_rl.contract.errors import StoreError, StoreReason
from gspo_rl.redisq.groups.store import RewardItem, RolloutStore
from gspo_rl.server.rollouts.protocol.rewards import RewardIn, RewardItemOut, RewardsOut

ITEM_REASON = {"unknown_rollout": StoreReason.NOT_FOUND, "conflict": StoreReason.CONFLICT,
               "expired": StoreReason.GONE, "closed": StoreReason.GONE}
"""Why a call failed, by the status of its first failing item."""
_MESSAGES = {
    "unknown_rollout": "unknown rollout (never recorded, or its records expired)",
    "conflict": "a different reward is already stored for this rollout",
    "expired": "the rollout's group expired before all its rewards arrived",
    "closed": "the rollout's group was finalised without this rollout",
}


@dataclass(frozen=True)
class RewardServing:
    """One per app (``app.state.serving_rewards``)."""

    store: RolloutStore

    async def post(self, items: Sequence[RewardIn]) -> RewardsOut:
        """Stores every item, or none (``StoreError``: see the module docstring)."""
        outcome = await self.store.post_rewards(
            [RewardItem(i.rollout_id, i.reward, i.turn_rewards) for i in items])
        results = [RewardItemOut(rollout_id=r.rollout_id, status=r.status,
                                 group_id=r.group_id, group_complete=r.group_complete)
                   for r in outcome.results]
        if not outcome.applied:
            raise _refusal(results)
        return RewardsOut(results=results,
                          stored=sum(r.status == "stored" for r in results),
                          duplicates=sum(r.status == "duplicate" for r in results))


def _refusal(results: list[RewardItemOut]) -> StoreError:
    """The error of a call that stored nothing: named after its first failing item."""
    failed = [r for r in results if r.status != "not_applied"]
    first = failed[0]
    where = f"item {results.index(first)} " if len(results) > 1 else ""
    message = f"{where}rollout {first.rollout_id!r}: {_MESSAGES.get(first.status, first.status)}"
    if len(failed) > 1:
        message += f" (and {len(failed) - 1} more failing item(s))"
    if len(results) > 1:
        message += "; nothing in this call was stored"
    return StoreError(ITEM_REASON.get(first.status, StoreReason.CONFLICT), first.status,
                      message, details={"results": [r.model_dump() for r in results]})
