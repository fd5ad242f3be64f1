"""``POST /v1/rewards``: one reward or a list of them in (``Rewards``: a list is told from one
item by its JSON type), every item's outcome out. Items are strict and refuse unknown fields;
rewards are finite numbers of at most ``MAX_ABS_REWARD``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

MAX_REWARDS_PER_CALL = 1024
MAX_TURNS = 4096
MAX_ABS_REWARD = 1e9  # far beyond any real reward; keeps the group's std finite in float32

FiniteFloat = Annotated[
    float, Field(strict=True, allow_inf_nan=False, ge=-MAX_ABS_REWARD, le=MAX_ABS_REWARD)
]


class RewardIn(BaseModel):
    """A reward for one rollout."""

    model_config = ConfigDict(extra="forbid", strict=True)

    rollout_id: str = Field(min_length=1, max_length=256)
    """The id the server returned with the rollout."""
    reward: FiniteFloat
    """The rollout's scalar reward (a finite JSON number)."""
    turn_rewards: list[FiniteFloat] | None = Field(default=None, max_length=MAX_TURNS)
    """Optional per-turn rewards of a multi-turn episode, stored and passed to the learner."""


def _body_kind(v: Any) -> str:
    return "many" if isinstance(v, list) else "one"


Rewards = Annotated[
    Annotated[RewardIn, Tag("one")]
    | Annotated[list[RewardIn], Tag("many"), Field(min_length=1, max_length=MAX_REWARDS_PER_CALL)],
    Discriminator(_body_kind),
]
"""The body: one ``RewardIn`` or a list of 1 to ``MAX_REWARDS_PER_CALL`` of them."""


class RewardItemOut(BaseModel):
    rollout_id: str
    status: Literal["stored", "duplicate", "unknown_rollout", "conflict", "expired", "closed",
                    "not_applied"]
    """stored | duplicate (same reward already stored: no change) | unknown_rollout (404) |
    conflict (another reward stored, 409) | expired / closed (group gone or finalised, 410) |
    not_applied (valid, but another item failed, so nothing of the call was stored)."""
    group_id: str | None = None
    group_complete: bool = False
    """This reward was the group's last: the group has been published (or dropped)."""


class RewardsOut(BaseModel):
    results: list[RewardItemOut]
    stored: int
    duplicates: int
