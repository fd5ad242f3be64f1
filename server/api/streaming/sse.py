"""``stream: true`` on chat and completions: OpenAI server-sent events, sent as generated.

``gspo_rl.server.api.streaming.group`` runs the group; the views here decide what each chunk
says. What is sent before the end is always a prefix of the non-streamed response
(``gspo_rl.server.rollouts.partial_text``), so joining the deltas gives the non-streamed
message. Chat sends ``delta.role`` first, then ``content`` / ``reasoning_content`` deltas
(with ``tools`` the content is held back to the final chunk, which carries it and the
``tool_calls`` whole); completions send ``text`` deltas; ``logprobs`` ride on the chunk that
first reports their tokens. Each choice's final chunk, sent once the group is recorded,
carries the rest of the text, ``finish_reason`` and the RL extension fields (``rollout_id``,
``token_ids``, ``prompt_token_ids``, ``policy_version``, ``policy_versions``). With
``stream_options.include_usage`` one last chunk with empty ``choices`` carries the usage.
Every chunk carries ``group_id``; ``[DONE]`` ends the stream. Turns of multi-turn episodes
stream the same way. The chunk-by-chunk contract: docs/design/streaming.md.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse

from gspo_rl.server.api.errors import APIError

SSE_RESPONSE_DOC: dict[int | str, dict[str, Any]] = {200: {
    "description": "The response; with stream=true, server-sent events of chunk objects "
                   "(chat.completion.chunk / text_completion) ending with `data: [DONE]`",
    "content": {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"],
        "properties": {"data": {"type": "string", "description": "A chunk object as JSON, or "
                                "[DONE] (the last event); an error object as JSON if the "
                                "stream fails after it started"}},
        "description": "One server-sent event (OpenAPI 3.1: the schema of each event)"}}}}}
"""The SSE variant of the 200 response, for the OpenAPI document."""


def include_usage(stream_options: dict[str, Any] | None) -> bool:
    """``stream_options.include_usage`` of a streamed request (400 when it is not a bool)."""
    value = (stream_options or {}).get("include_usage", False)
    if not isinstance(value, bool):
        raise APIError(400, "stream_options.include_usage must be true or false",
                       code="invalid_parameter")
    return value


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    """The events as ``text/event-stream`` (not cached, not buffered by proxies)."""
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
