"""``stream: true`` on chat and completions: OpenAI server-sent events, sent as generated.

New groups stream incrementally (``server.stream_group`` runs the group; the views here decide
what each chunk says). What is sent before the end is always a prefix of the non-streamed
response (``server.stream_text``), so joining the deltas gives the non-streamed message:

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

A turn of a multi-turn episode (chat with a ``rollout_id``) is sent buffered
(``chat_chunks``): the turn is sampled and appended to its rollout first, then sent as
chunks of the same shape (one chunk per choice with the whole content).
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


def sse(payload: dict[str, Any] | str) -> str:
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
    return sse({**_head(resp, obj, False), "choices": [], "usage": resp.usage.model_dump()})


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
        yield sse({**head, "choices": [{"index": c.index, "delta": role, "logprobs": None,
                                         "finish_reason": None}]})
        logprobs = c.logprobs.model_dump() if c.logprobs is not None else None
        yield sse({**head, "choices": [{
            "index": c.index, "delta": _chat_delta(c.message), "logprobs": logprobs,
            "finish_reason": c.finish_reason, **_rl_fields(c)}]})
    if with_usage:
        yield _usage_chunk(resp, obj)
    yield sse("[DONE]")


def sse_response(events: Iterator[str]) -> StreamingResponse:
    """The events as ``text/event-stream`` (not cached, not buffered by proxies)."""
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
