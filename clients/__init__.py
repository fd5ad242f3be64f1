"""The environment SDK: what an environment author imports. httpx only, no torch.

    from gspo_rl.client import GSPOClient, SingleTurnEnvironment, run_groups
"""

from gspo_rl.client.client import AsyncGSPOClient, GSPOClient, Rollout, RolloutGroup
from gspo_rl.client.environment import (
    EpisodeResult,
    EpisodeSession,
    MultiTurnEnvironment,
    SingleTurnEnvironment,
)
from gspo_rl.client.errors import (
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    ConcurrentTurn,
    ConflictError,
    EpisodeFinished,
    EpisodeSettingsChanged,
    GroupExpired,
    GSPOError,
    HistoryMismatch,
    InternalServerError,
    NotFound,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RequestRejected,
    RequestTooLargeError,
    RewardAlreadySet,
    RewardConflict,
    ServerUnavailable,
    UnprocessableEntityError,
)
from gspo_rl.client.runner import arun_groups, run_groups

__all__ = [
    "APIStatusError", "AsyncGSPOClient", "AuthenticationError", "BadRequestError",
    "ConcurrentTurn", "ConflictError", "EpisodeFinished", "EpisodeResult", "EpisodeSession",
    "EpisodeSettingsChanged", "GSPOClient", "GSPOError", "GroupExpired", "HistoryMismatch",
    "InternalServerError", "MultiTurnEnvironment", "NotFound", "NotFoundError",
    "PermissionDeniedError", "RateLimitError", "RequestRejected", "RequestTooLargeError",
    "RewardAlreadySet", "RewardConflict", "Rollout", "RolloutGroup", "ServerUnavailable",
    "SingleTurnEnvironment", "UnprocessableEntityError", "arun_groups", "run_groups",
]
