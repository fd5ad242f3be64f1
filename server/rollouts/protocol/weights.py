"""``/admin``: the weight routes' bodies. The join, broadcast and CUDA IPC requests themselves
are the contract's (``gspo_rl.contract.weights``), shared with the learner that sends them;
``UpdateBody`` adds the server-side bound of one broadcast receive."""

from __future__ import annotations

from pydantic import BaseModel

from gspo_rl.contract.weights.collective import UpdateRequest


class VersionResponse(BaseModel):
    policy_version: int
    paused: bool = False


class UpdateBody(UpdateRequest):
    timeout_s: float = 120.0
    """Upper bound for receiving every bucket."""
