"""Request and response bodies of the sampling routes (OpenAI-compatible and native).

OpenAI bodies ignore unknown fields (clients send many; vLLM does the same) but refuse the
known ones whose meaning this server would silently change (non-zero penalties, ``echo``;
``stream: true`` is served by ``gspo_rl.server.api.streaming.sse``); the checks that need the engine
or the settings live in ``gspo_rl.server.rollouts.sampling``. The native ``/v1/rollouts`` body
forbids unknown fields: a typo there would otherwise train on the wrong settings.

Every choice carries extension fields for RL: ``token_ids``, ``prompt_token_ids``,
``rollout_id``, ``policy_version`` (the version that sampled the first token) and
``policy_versions`` (one per token: weights can change in the middle of a completion). A request
with ``"record": false`` is served and not recorded: its ``group_id`` and ``rollout_id`` are null.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gspo_rl.server.rollouts.limits import Metadata

Role = Literal["system", "developer", "user", "assistant", "tool"]


class _OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="ignore")


# ---------------------------------------------------------------------------- chat input
class ContentPart(_OpenAIBody):
    type: str
    text: str | None = None


class FunctionCallIn(_OpenAIBody):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_OpenAIBody):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_OpenAIBody):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    """An assistant message's reasoning as a reasoning parser returned it (templates such as
    Qwen3's read it)."""


class FunctionDef(_OpenAIBody):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_OpenAIBody):
    type: Literal["function"] = "function"
    function: FunctionDef


class SamplingFields(BaseModel):
    """Fields every sampling route shares. None: the server's default."""

    n: int = Field(default=1, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    """0 (greedy) is refused (400) for a recorded request: greedy tokens come from no
    distribution the learner could train under. Allowed with ``record: false``."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    """vLLM extension; 0 or -1: off. ``top_p`` / ``top_k`` are recorded with the rollout and
    the learner trains under the same truncated distribution."""
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63 - 2**16)
    """With n > 1, sample i uses seed + i: n copies of one sample would carry no signal."""
    ignore_eos: bool = False
    """vLLM extension: do not stop at EOS / end of turn (benchmarks, fixed-length rollouts)."""
    metadata: Metadata | None = None
    """Stored with the group in Redis (the environment's task id, answer key, ...)."""
    record: bool = True
    """Extension. false: serve the request without recording it (evaluation, inference): no
    group, no admission, nothing written to Redis, nothing trained; served also after the
    learner's target (no 503 ``training_finished``). Token ids, log-probabilities and policy
    versions come back as usual; ``group_id`` and ``rollout_id`` are null."""


class ChatCompletionRequest(SamplingFields, _OpenAIBody):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM extension: extra variables for the chat template (``{"enable_thinking": false}``
    for Qwen3)."""
    rollout_id: str | None = Field(default=None, min_length=1, max_length=256)
    """Extension: the multi-turn episode (``POST /v1/groups``) this turn belongs to; the turn
    is appended to that episode's trajectory (``gspo_rl.server.rollouts.episodes``). Send it with
    the openai client as ``extra_body={"rollout_id": ...}``."""


class CompletionRequest(SamplingFields, _OpenAIBody):
    model: str
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None


class RolloutRequest(SamplingFields):
    """A group of ``n`` samples of one prompt, given as exactly one of ``prompt`` (raw text),
    ``messages`` (chat, templated with ``tools``) or ``prompt_token_ids``."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    prompt_token_ids: list[int] | None = None
    tools: list[Tool] | None = None
    top_logprobs: int = Field(default=0, ge=0)
    """Also return the k most likely tokens at each step."""


# ---------------------------------------------------------------------------- outputs
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class RLFields(BaseModel):
    """The RL extension fields of one choice / rollout."""

    rollout_id: str | None
    """The recorded rollout the reward goes to (null: ``record: false``)."""
    token_ids: list[int]
    policy_version: int
    policy_versions: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    """The model's reasoning, split off ``content`` by the server's reasoning parser (None
    without one). The stored trajectory keeps every sampled token either way."""
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(RLFields):
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: ChoiceLogprobs | None = None
    prompt_token_ids: list[int]


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    group_id: str | None
    """The recorded group (null: ``record: false``)."""


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(RLFields):
    index: int
    text: str
    finish_reason: str
    logprobs: CompletionLogprobs | None = None
    prompt_token_ids: list[int]


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    group_id: str | None
    """The recorded group (null: ``record: false``)."""


class RolloutOut(RLFields):
    text: str
    logprobs: list[float]
    finish_reason: str
    top_logprobs: list[list[TopLogprob]] | None = None


class RolloutResponse(BaseModel):
    group_id: str | None
    """The recorded group (null: ``record: false``)."""
    model: str
    prompt_token_ids: list[int]
    rollouts: list[RolloutOut]
    usage: Usage
