"""What the client is shown of a completion: reasoning, content and tool calls, by the
server's ``reasoning_parser`` and ``tool_call_parser``
(``gspo_rl.server.rollouts.parsers.reasoning``, ``gspo_rl.server.rollouts.parsers.tool_calls``).
Parsing changes only the response: the stored trajectory is the sampled token ids, and an episode
compares the echoed message with this parsed form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gspo_rl.server.rollouts.chat.render import ParsedToolCall
from gspo_rl.server.rollouts.parsers.reasoning import split_reasoning
from gspo_rl.server.rollouts.parsers.tool_calls import parse_calls


@dataclass(frozen=True)
class AssistantParse:
    content: str | None
    reasoning: str | None = None
    calls: list[ParsedToolCall] = field(default_factory=list)


def parse_assistant(text: str, *, tool_parser: str, reasoning_parser: str, with_tools: bool,
                    tools: list[dict[str, Any]] | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> AssistantParse:
    """Reasoning first (tool calls inside the reasoning are thoughts, not calls), then tool
    calls in what remains when the request has tools."""
    thinking = (template_kwargs or {}).get("enable_thinking", True) is not False
    reasoning, content = split_reasoning(text, reasoning_parser, thinking)
    if not with_tools or content is None:
        return AssistantParse(content, reasoning)
    content, calls = parse_calls(content, tool_parser, tools)
    return AssistantParse(content, reasoning, calls)
