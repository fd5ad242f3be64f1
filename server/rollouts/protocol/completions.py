"""``POST /v1/completions``: the OpenAI legacy completions request (one prompt, as text or
token ids, sampled ``n`` times as one group) and response, with the RL extension fields per
choice. ``echo``, ``suffix`` and ``best_of`` > 1 are refused (their schemas say so)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, WithJsonSchema

from gspo_rl.server.rollouts.fields import Int, doc_only, int_in
from gspo_rl.server.rollouts.protocol.base import (
    NO_LOGIT_BIAS,
    NO_PENALTY,
    STREAM_OPTIONS,
    OpenAIBody,
    RLFields,
    SamplingFields,
    Usage,
)

TOKEN_IDS_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
"""A prompt as token ids: at least one, each in the vocabulary (a running server's
``/openapi.json`` gives the vocabulary's size as ``maximum``)."""
_ONE_PROMPT = WithJsonSchema({"anyOf": [
    {"type": "string", "minLength": 1},
    TOKEN_IDS_SCHEMA,
    {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
    {"type": "array", "items": TOKEN_IDS_SCHEMA, "minItems": 1, "maxItems": 1}]})


class CompletionRequest(SamplingFields, OpenAIBody):
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
    stream_options: Annotated[dict[str, Any] | None, STREAM_OPTIONS] = None
    user: str | None = None
    presence_penalty: Annotated[float | None, NO_PENALTY] = 0.0
    frequency_penalty: Annotated[float | None, NO_PENALTY] = 0.0
    logit_bias: Annotated[dict[str, float] | None, NO_LOGIT_BIAS] = None


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
