"""Every body on the wire, one module per resource (vLLM's ``protocol``): the sampling routes
(``chat``, ``completions``, ``rollouts``, over ``base`` and ``messages``), ``groups``,
``rewards``, ``evals``, ``tasks``, ``models``, ``health`` and the admin ``weights``. Route
modules hold none: they bind these to HTTP. Each name is re-exported here.

OpenAI bodies ignore unknown fields (clients send many; vLLM does the same) but refuse the
known ones whose meaning this server would silently change (non-zero penalties, ``echo``;
``stream: true`` is served by ``gspo_rl.server.api.streaming.sse``); the checks that need the
engine or the settings live in ``gspo_rl.server.rollouts.sampling``. Native bodies forbid
unknown fields: a typo there would otherwise train on the wrong settings. Types are strict
(``"n": "2"`` is a 422, not 2), and each schema says what those checks refuse
(``gspo_rl.server.rollouts.fields``), so the OpenAPI document says exactly what the server
accepts. Class names are the OpenAPI document's component names: keep them unique.

Every choice carries extension fields for RL: ``token_ids``, ``prompt_token_ids``,
``rollout_id``, ``policy_version`` (the version that sampled the first token) and
``policy_versions`` (one per token: weights can change in the middle of a completion). A
request with ``"record": false`` is served and not recorded: its ``group_id`` and
``rollout_id`` are null.
"""

from __future__ import annotations

from gspo_rl.server.rollouts.protocol.base import (
    OpenAIBody,
    RLFields,
    SamplingFields,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from gspo_rl.server.rollouts.protocol.chat import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChoiceLogprobs,
    FunctionCallOut,
    ToolCallOut,
)
from gspo_rl.server.rollouts.protocol.completions import (
    TOKEN_IDS_SCHEMA,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from gspo_rl.server.rollouts.protocol.evals import EvalIn, EvalList, EvalOut
from gspo_rl.server.rollouts.protocol.groups import (
    AbandonOut,
    GroupOut,
    GroupRolloutOut,
    OpenGroupIn,
    OpenGroupOut,
)
from gspo_rl.server.rollouts.protocol.health import HealthResponse, LearnerHealth, RedisState
from gspo_rl.server.rollouts.protocol.messages import (
    AssistantMessageIn,
    ChatMessage,
    Content,
    ContentPart,
    DeveloperMessage,
    FunctionCallIn,
    FunctionDef,
    Role,
    SystemMessage,
    Tool,
    ToolCallIn,
    ToolMessage,
    UserMessage,
)
from gspo_rl.server.rollouts.protocol.models import ModelCard, ModelList
from gspo_rl.server.rollouts.protocol.rewards import (
    RewardIn,
    RewardItemOut,
    Rewards,
    RewardsOut,
)
from gspo_rl.server.rollouts.protocol.rollouts import RolloutOut, RolloutRequest, RolloutResponse
from gspo_rl.server.rollouts.protocol.tasks import TaskStats, TaskStatsList, TaskStatsQuery
from gspo_rl.server.rollouts.protocol.weights import UpdateBody, VersionResponse

__all__ = [
    "TOKEN_IDS_SCHEMA", "AbandonOut", "AssistantMessage", "AssistantMessageIn", "ChatChoice",
    "ChatCompletionRequest", "ChatCompletionResponse", "ChatMessage", "ChoiceLogprobs",
    "CompletionChoice", "CompletionLogprobs", "CompletionRequest", "CompletionResponse",
    "Content", "ContentPart", "DeveloperMessage", "EvalIn", "EvalList", "EvalOut",
    "FunctionCallIn", "FunctionCallOut", "FunctionDef", "GroupOut", "GroupRolloutOut",
    "HealthResponse", "LearnerHealth", "ModelCard", "ModelList", "OpenAIBody", "OpenGroupIn",
    "OpenGroupOut", "RLFields", "RedisState", "RewardIn", "RewardItemOut", "Rewards",
    "RewardsOut", "Role", "RolloutOut", "RolloutRequest", "RolloutResponse", "SamplingFields",
    "SystemMessage", "TaskStats", "TaskStatsList", "TaskStatsQuery", "TokenLogprob", "Tool",
    "ToolCallIn", "ToolCallOut", "ToolMessage", "TopLogprob", "UpdateBody", "Usage",
    "UserMessage", "VersionResponse",
]
