"""``stream: true`` on chat and completions: OpenAI server-sent events, sent as generated.

Responses stream incrementally (``gspo_rl.server.api.streaming.group`` runs the group; the views
here decide what each chunk says). What is sent before the end is always a prefix of the
non-streamed response (``gspo_rl.server.rollouts.partial_text``), so joining the deltas gives the
non-streamed message:

- chat: a first chunk per choice with ``delta.role`` (and ``content: ""`` when no parser can
  claim text); then chunks with ``content`` / ``reasoning_content`` deltas as tokens come.
  Reasoning is streamed through the reasoning parser's rule (``stable_split``). With ``tools``
  in the request (tool_choice not ``none``) the content is held back to the final chunk: the
  tool-call parser may claim any of it (Hermes blocks sit anywhere in the text; a malformed
  call leaves the whole text content), so the final chunk carries the content and
  ``tool_calls`` whole (``index`` per call), as a non-streamed response says them;
- completions: chunks with ``text`` deltas;
- ``logprobs`` (when asked) ride on the chunk that first reports their tokens, so a client
  that joins them gets the non-streamed list (chat ``logprobs.content``; completions'
  ``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset`` from the completion's
  start); a chunk may carry log-probabilities of tokens whose text is still held back;
- the final chunk of each choice, sent once the group is recorded: the rest of the text,
  ``finish_reason`` and the RL extension fields (``rollout_id``, ``token_ids``,
  ``prompt_token_ids``, ``policy_version``, ``policy_versions``);
- with ``stream_options.include_usage`` every chunk has ``usage: null`` and one last chunk
  with empty ``choices`` carries the usage, as OpenAI sends it. Every chunk carries the
  top-level ``group_id`` extension; ``[DONE]`` ends the stream.

A turn of a multi-turn episode (chat with a ``rollout_id``) streams the same way; the turn is
appended to its rollout (``episodes.commit_turn``, as a non-streamed turn) before its final
chunk, and the chunks name the episode's group.
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
    "content": {"text/event-stream": {"schema": {"type": "string"}}}}}
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
