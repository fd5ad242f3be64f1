"""Chat input: the messages of a conversation (one model per role) and the tools a chat
template renders. Only text content: a part of another type is refused with a 400 that says
this server serves a text model."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from gspo_rl.server.rollouts.protocol.base import OpenAIBody

Role = Literal["system", "developer", "user", "assistant", "tool"]


def _text_part_only(schema: dict[str, Any]) -> None:
    schema["properties"]["type"] = {"const": "text", "type": "string", "title": "Type"}
    schema["properties"]["text"] = {"type": "string", "title": "Text"}
    schema["required"] = ["type", "text"]


class ContentPart(OpenAIBody):
    """A part of a message's content: only text (the schema says so; a part of another type
    is refused with a 400 that says this server serves a text model)."""

    model_config = ConfigDict(json_schema_extra=_text_part_only)

    type: str
    text: str | None = None


class FunctionCallIn(OpenAIBody):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(OpenAIBody):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class _Message(OpenAIBody):
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


class FunctionDef(OpenAIBody):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(OpenAIBody):
    type: Literal["function"] = "function"
    function: FunctionDef
