"""The environment SDK: what an environment author imports. httpx only, no torch.

    from clients import GSPOClient, SingleTurnEnvironment, run_groups
"""

from clients.client import AsyncGSPOClient, GSPOClient, Rollout, RolloutGroup
from clients.environment import (
    EpisodeResult,
    EpisodeSession,
    MultiTurnEnvironment,
    SingleTurnEnvironment,
    arun_groups,
    run_groups,
)
from clients.errors import (
    GroupExpired,
    GSPOError,
    NotFound,
    RequestRejected,
    RewardConflict,
    ServerUnavailable,
)

__all__ = [
    "AsyncGSPOClient", "EpisodeResult", "EpisodeSession", "GSPOClient", "GSPOError",
    "GroupExpired", "MultiTurnEnvironment", "NotFound", "RequestRejected", "RewardConflict",
    "Rollout", "RolloutGroup", "ServerUnavailable", "SingleTurnEnvironment", "arun_groups",
    "run_groups",
]
