"""``stream: true`` on chat and completions: the response as OpenAI server-sent events.

A streamed request runs exactly the pipeline of a non-streamed one (sample the group, record
it in Redis, build the response object); only then is that response sent as SSE chunks
(``data: {json}\\n\\n`` ... ``data: [DONE]\\n\\n``). Buffering the group before the first byte
keeps three properties the RL side needs:

- a streamed completion is recorded exactly as a non-streamed one (same code, same record);
- every error (validation, limits, engine, Redis) is still a JSON 4xx/5xx, since nothing has
  been sent when it is raised;
- a client that leaves during generation still cancels the decoding
  (``server.disconnect`` only cancels before the response has started).

Chunks per choice (chat): one with ``delta.role``, then the final one carrying the content
(``content``, ``reasoning_content``, ``tool_calls`` with their ``index``), ``logprobs`` when
asked, ``finish_reason`` and the RL extension fields (``rollout_id``, ``token_ids``,
``prompt_token_ids``, ``policy_version``, ``policy_versions``). Completions: one chunk per
choice with the text and the same fields. With ``stream_options.include_usage`` every chunk
has ``usage: null`` and one last chunk with empty ``choices`` carries the usage, as OpenAI
sends it. Every chunk carries the top-level ``group_id`` extension.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from starlette.responses import StreamingResponse

from server.api_models import ChatCompletionResponse, CompletionResponse
from server.errors import APIError

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


def _sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def _head(resp: ChatCompletionResponse | CompletionResponse, obj: str,
          with_usage: bool) -> dict[str, Any]:
    head: dict[str, Any] = {"id": resp.id, "object": obj, "created": resp.created,
                            "model": resp.model, "group_id": resp.group_id}
    if with_usage:
        head["usage"] = None
    return head


def _usage_chunk(resp: ChatCompletionResponse | CompletionResponse, obj: str) -> str:
    return _sse({**_head(resp, obj, False), "choices": [], "usage": resp.usage.model_dump()})


def _rl_fields(choice: Any) -> dict[str, Any]:
    return {"rollout_id": choice.rollout_id, "token_ids": choice.token_ids,
            "prompt_token_ids": choice.prompt_token_ids,
            "policy_version": choice.policy_version, "policy_versions": choice.policy_versions}


def _chat_delta(message: Any) -> dict[str, Any]:
    delta: dict[str, Any] = {"content": message.content}
    if message.reasoning_content is not None:
        delta["reasoning_content"] = message.reasoning_content
    if message.tool_calls:
        delta["tool_calls"] = [{"index": j, **call.model_dump()}
                               for j, call in enumerate(message.tool_calls)]
    return delta


def chat_chunks(resp: ChatCompletionResponse, with_usage: bool) -> Iterator[str]:
    """The SSE events of a chat response (module docstring)."""
    obj = "chat.completion.chunk"
    head = _head(resp, obj, with_usage)
    for c in resp.choices:
        # content "" as OpenAI sends it, None for a choice without content (tool calls): a
        # client that joins the deltas then gets the non-streamed message's content.
        role = {"role": "assistant", "content": "" if c.message.content is not None else None}
        yield _sse({**head, "choices": [{"index": c.index, "delta": role, "logprobs": None,
                                         "finish_reason": None}]})
        logprobs = c.logprobs.model_dump() if c.logprobs is not None else None
        yield _sse({**head, "choices": [{
            "index": c.index, "delta": _chat_delta(c.message), "logprobs": logprobs,
            "finish_reason": c.finish_reason, **_rl_fields(c)}]})
    if with_usage:
        yield _usage_chunk(resp, obj)
    yield _sse("[DONE]")


def completion_chunks(resp: CompletionResponse, with_usage: bool) -> Iterator[str]:
    """The SSE events of a completions response (module docstring)."""
    obj = "text_completion"
    head = _head(resp, obj, with_usage)
    for c in resp.choices:
        logprobs = c.logprobs.model_dump() if c.logprobs is not None else None
        yield _sse({**head, "choices": [{
            "index": c.index, "text": c.text, "logprobs": logprobs,
            "finish_reason": c.finish_reason, **_rl_fields(c)}]})
    if with_usage:
        yield _usage_chunk(resp, obj)
    yield _sse("[DONE]")


def sse_response(events: Iterator[str]) -> StreamingResponse:
    """The events as ``text/event-stream`` (not cached, not buffered by proxies)."""
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
