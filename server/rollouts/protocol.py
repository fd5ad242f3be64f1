"""Request and response bodies of the sampling routes (OpenAI-compatible and native).

OpenAI bodies ignore unknown fields (clients send many; vLLM does the same) but refuse the
known ones whose meaning this server would silently change (non-zero penalties, ``echo``;
``stream: true`` is served by ``gspo_rl.server.api.streaming.sse``); the checks that need the engine
or the settings live in ``gspo_rl.server.rollouts.sampling``. The native ``/v1/rollouts`` body
forbids unknown fields: a typo there would otherwise train on the wrong settings. Types are
strict (``"n": "2"`` is a 422, not 2), and each schema says what those checks refuse
(``gspo_rl.server.rollouts.fields``), so the OpenAPI document says exactly what the server
accepts.

Every choice carries extension fields for RL: ``token_ids``, ``prompt_token_ids``,
``rollout_id``, ``policy_version`` (the version that sampled the first token) and
``policy_versions`` (one per token: weights can change in the middle of a completion). A request
with ``"record": false`` is served and not recorded: its ``group_id`` and ``rollout_id`` are null.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.config import JsonDict

from gspo_rl.contract.chat.sanitize import TEMPLATE_ARGS
from gspo_rl.server.rollouts.fields import Int, doc_only, int_in, not_null
from gspo_rl.server.rollouts.limits import MAX_STOP_STRINGS, MIN_TEMPERATURE, Metadata

Role = Literal["system", "developer", "user", "assistant", "tool"]


class _OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


# ---------------------------------------------------------------------------- chat input
def _text_part_only(schema: dict[str, Any]) -> None:
    schema["properties"]["type"] = {"const": "text", "type": "string", "title": "Type"}
    schema["properties"]["text"] = {"type": "string", "title": "Text"}
    schema["required"] = ["type", "text"]


class ContentPart(_OpenAIBody):
    """A part of a message's content: only text (the schema says so; a part of another type
    is refused with a 400 that says this server serves a text model)."""

    model_config = ConfigDict(json_schema_extra=_text_part_only)

    type: str
    text: str | None = None


class FunctionCallIn(_OpenAIBody):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_OpenAIBody):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class _Message(_OpenAIBody):
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    """An assistant message's reasoning as a reasoning parser returned it (templates such as
    Qwen3's read it)."""


Content = str | list[ContentPart]


class SystemMessage(_Message):
    role: Literal["system"]
    content: Content


class DeveloperMessage(_Message):
    role: Literal["developer"]
    content: Content


class UserMessage(_Message):
    role: Literal["user"]
    content: Content


class ToolMessage(_Message):
    role: Literal["tool"]
    content: Content
    """The tool's answer (use "" for an empty one)."""


class AssistantMessageIn(_Message):
    """An earlier assistant turn: ``content`` may be null beside ``tool_calls``."""

    role: Literal["assistant"]


ChatMessage = Annotated[SystemMessage | DeveloperMessage | UserMessage | ToolMessage
                        | AssistantMessageIn, Field(discriminator="role")]
"""One chat message, by its role: every role but the assistant's needs ``content``."""


class FunctionDef(_OpenAIBody):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_OpenAIBody):
    type: Literal["function"] = "function"
    function: FunctionDef


class SamplingFields(BaseModel):
    """Fields every sampling route shares. None: the server's default. ``n``, ``max_tokens``
    and the top log-probs are bounded by the server's settings (its ``/openapi.json`` says
    by how much: ``gspo_rl.server.api.openapi``)."""

    model_config = ConfigDict(strict=True)

    n: int_in(ge=1) = 1  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    temperature: Annotated[float | None, doc_only(minimum=MIN_TEMPERATURE)] = Field(
        default=None, ge=0.0, le=2.0)
    """At least 0.001 for a recorded request: 0 (greedy) is refused (400), greedy tokens come
    from no distribution the learner could train under. Any value with ``record: false``."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int_in(ge=-1) | None = None  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    """vLLM extension; 0 or -1: off. ``top_p`` / ``top_k`` are recorded with the rollout and
    the learner trains under the same truncated distribution."""
    max_tokens: int_in(ge=1) | None = None  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    stop: Annotated[str | list[str] | None, doc_only(
        minLength=1, maxItems=MAX_STOP_STRINGS, items={"type": "string", "minLength": 1})] = None
    """At most 16 strings, none empty."""
    seed: int_in(ge=-(2**63), lt=2**63 - 2**16) | None = None  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
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


# What the rollout layer refuses of the OpenAI options, as schema keywords (doc_only).
_NO_PENALTY = doc_only(minimum=0, maximum=0)
_NO_LOGIT_BIAS = doc_only(maxProperties=0)
_STREAM_OPTIONS = doc_only(properties={"include_usage": {"type": "boolean"}})
_CHAT_RULES: JsonDict = {"allOf": [
    {"if": {"required": ["top_logprobs"],
            "properties": {"top_logprobs": {"type": "integer", "minimum": 1}}},
     "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}},
    # a turn of an episode is always recorded
    {"if": {"required": ["record"], "properties": {"record": {"const": False}}},
     "then": {"properties": {"rollout_id": {"type": "null"}}}}]}


class ChatCompletionRequest(SamplingFields, _OpenAIBody):
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
    stream_options: Annotated[dict[str, Any] | None, _STREAM_OPTIONS] = None
    user: str | None = None
    presence_penalty: Annotated[float | None, _NO_PENALTY] = 0.0
    """Only 0: a penalty would change the sampled distribution away from the policy's."""
    frequency_penalty: Annotated[float | None, _NO_PENALTY] = 0.0
    """Only 0 (see ``presence_penalty``)."""
    logit_bias: Annotated[dict[str, float] | None, _NO_LOGIT_BIAS] = None
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


TOKEN_IDS_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
"""A prompt as token ids: at least one, each in the vocabulary (a running server's
``/openapi.json`` gives the vocabulary's size as ``maximum``)."""
_ONE_PROMPT = WithJsonSchema({"anyOf": [
    {"type": "string", "minLength": 1},
    TOKEN_IDS_SCHEMA,
    {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
    {"type": "array", "items": TOKEN_IDS_SCHEMA, "minItems": 1, "maxItems": 1}]})


class CompletionRequest(SamplingFields, _OpenAIBody):
    model: str
    prompt: Annotated[str | list[Int] | list[str] | list[list[Int]], _ONE_PROMPT]
    """One prompt (text or token ids, not empty; a list of one prompt is one prompt):
    ``n`` samples of it form one group."""
    logprobs: int_in(ge=0) | None = None  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    echo: Annotated[bool | None, doc_only(enum=[False, None])] = False
    """Not supported: the response's ``prompt_token_ids`` carry the prompt."""
    suffix: Annotated[str | None, doc_only(maxLength=0)] = None
    """Not supported."""
    best_of: Annotated[Int | None, doc_only(enum=[1, None])] = None
    """Only 1 (every sample is returned)."""
    stream: bool | None = False
    stream_options: Annotated[dict[str, Any] | None, _STREAM_OPTIONS] = None
    user: str | None = None
    presence_penalty: Annotated[float | None, _NO_PENALTY] = 0.0
    frequency_penalty: Annotated[float | None, _NO_PENALTY] = 0.0
    logit_bias: Annotated[dict[str, float] | None, _NO_LOGIT_BIAS] = None


_PROMPT_FORMS = ("prompt", "messages", "prompt_token_ids")
_ONE_PROMPT_FORM: JsonDict = {"oneOf": [{"required": [name]} for name in _PROMPT_FORMS],
                    "dependentRequired": {"tools": ["messages"]}}


class RolloutRequest(SamplingFields):
    """A group of ``n`` samples of one prompt, given as exactly one of ``prompt`` (raw text),
    ``messages`` (chat, templated with ``tools``) or ``prompt_token_ids``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_ONE_PROMPT_FORM)

    model: str | None = None
    prompt: Annotated[str | None, WithJsonSchema({"type": "string", "minLength": 1})] = None
    messages: Annotated[list[ChatMessage] | None, not_null(minItems=1)] = None
    prompt_token_ids: Annotated[list[Int] | None, WithJsonSchema(TOKEN_IDS_SCHEMA)] = None
    tools: Annotated[list[Tool] | None, not_null()] = None
    """Only with ``messages`` (the chat template renders them)."""
    top_logprobs: int_in(ge=0) = 0  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    """Also return the k most likely tokens at each step."""

    @model_validator(mode="before")
    @classmethod
    def _no_null_prompt(cls, data: Any) -> Any:
        """A prompt form or ``tools`` sent as null is refused (omit it): the schema makes
        exactly one form required, and a null would count as given."""
        if isinstance(data, dict):
            nulls = [k for k in (*_PROMPT_FORMS, "tools") if k in data and data[k] is None]
            if nulls:
                raise ValueError(f"{', '.join(nulls)}: null is not a value here, omit it")
        return data


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
