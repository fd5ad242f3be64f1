"""``POST /v1/rollouts``: the native group call (``n`` samples of one prompt, given as exactly
one of raw text, chat messages or token ids) and its response (per rollout: its id, tokens,
behavior log-probabilities and policy versions). Unknown fields are refused: a typo here would
otherwise train on the wrong settings."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, WithJsonSchema, model_validator
from pydantic.config import JsonDict

from gspo_rl.server.rollouts.fields import Int, int_in, not_null
from gspo_rl.server.rollouts.protocol.base import RLFields, SamplingFields, TopLogprob, Usage
from gspo_rl.server.rollouts.protocol.completions import TOKEN_IDS_SCHEMA
from gspo_rl.server.rollouts.protocol.messages import ChatMessage, Tool

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
