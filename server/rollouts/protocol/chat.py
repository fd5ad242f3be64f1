"""``POST /v1/chat/completions``: the OpenAI chat request and response, with the RL extensions
(``rollout_id`` of a multi-turn episode in; token ids, log-probabilities and policy versions
out per choice).

The request refuses, in its schema and in the rollout layer's checks, the known options
whose meaning this server would silently change (non-zero penalties, ``logit_bias``, a
``response_format`` other than text, a constrained ``tool_choice``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

from gspo_rl.contract.chat.sanitize import TEMPLATE_ARGS
from gspo_rl.server.rollouts.fields import doc_only, int_in
from gspo_rl.server.rollouts.protocol.base import (
    NO_LOGIT_BIAS,
    NO_PENALTY,
    STREAM_OPTIONS,
    OpenAIBody,
    RLFields,
    SamplingFields,
    TokenLogprob,
    Usage,
)
from gspo_rl.server.rollouts.protocol.messages import ChatMessage, Tool

_CHAT_RULES: JsonDict = {"allOf": [
    {"if": {"required": ["top_logprobs"],
            "properties": {"top_logprobs": {"type": "integer", "minimum": 1}}},
     "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}},
    # a turn of an episode is always recorded
    {"if": {"required": ["record"], "properties": {"record": {"const": False}}},
     "then": {"properties": {"rollout_id": {"type": "null"}}}}]}


class ChatCompletionRequest(SamplingFields, OpenAIBody):
    model_config = ConfigDict(json_schema_extra=_CHAT_RULES)

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int_in(ge=1) | None = None  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    logprobs: bool = False
    top_logprobs: int_in(ge=0) | None = None  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    """Needs ``logprobs: true``."""
    tools: list[Tool] | None = None
    tool_choice: Annotated[str | dict[str, Any] | None,
                           doc_only(enum=["auto", "none", None])] = None
    """"auto" or "none": the server does not constrain decoding."""
    parallel_tool_calls: bool | None = None
    stream: bool | None = False
    stream_options: Annotated[dict[str, Any] | None, STREAM_OPTIONS] = None
    user: str | None = None
    presence_penalty: Annotated[float | None, NO_PENALTY] = 0.0
    """Only 0: a penalty would change the sampled distribution away from the policy's."""
    frequency_penalty: Annotated[float | None, NO_PENALTY] = 0.0
    """Only 0 (see ``presence_penalty``)."""
    logit_bias: Annotated[dict[str, float] | None, NO_LOGIT_BIAS] = None
    """Not supported: omit it (or send {})."""
    response_format: Annotated[dict[str, Any] | None, doc_only(
        properties={"type": {"const": "text"}})] = None
    """Only ``{"type": "text"}``."""
    chat_template_kwargs: Annotated[dict[str, Any] | None, doc_only(
        propertyNames={"not": {"enum": sorted(TEMPLATE_ARGS)}})] = None
    """vLLM extension: extra variables for the chat template (``{"enable_thinking": false}``
    for Qwen3)."""
    rollout_id: str | None = Field(default=None, min_length=1, max_length=256)
    """Extension: the multi-turn episode (``POST /v1/groups``) this turn belongs to; the turn
    is appended to that episode's trajectory (``gspo_rl.server.rollouts.episodes``). Send it with
    the openai client as ``extra_body={"rollout_id": ...}``."""


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
