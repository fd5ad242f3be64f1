"""``POST /v1/chat/completions``: OpenAI chat, with tool calls, recorded as a group of n.

A request carrying the ``rollout_id`` of an episode opened with ``POST /v1/groups`` is one more
turn of that multi-turn episode instead of a new group. The work is ``ChatServing``'s
(``gspo_rl.server.rollouts.serving.chat``); ``stream: true`` is sent by
``gspo_rl.server.api.streaming.serve``.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from starlette.responses import StreamingResponse

from gspo_rl.server.api.deps import ChatDep, admit_new_group
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.api.streaming.serve import stream_chat
from gspo_rl.server.api.streaming.sse import SSE_RESPONSE_DOC, include_usage
from gspo_rl.server.rollouts.protocol.chat import ChatCompletionRequest, ChatCompletionResponse
from gspo_rl.server.rollouts.serving.chat import PLAIN_CALL_NOTE, RECORDED_HEADER

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse,
             dependencies=[Depends(admit_new_group)],
             responses={**error_responses(*V1_POST, 404, 409, 410, 501), **SSE_RESPONSE_DOC})
async def chat_completions(body: ChatCompletionRequest, chat: ChatDep,
                           response: Response) -> ChatCompletionResponse | StreamingResponse:
    """Samples ``n`` assistant turns; each is recorded in Redis as one rollout of a group.
    With ``stream: true`` the turns are sent as server-sent events as they are generated,
    and recorded before their final chunks (``gspo_rl.server.api.streaming.sse``). A plain
    call (one sample, no ``rollout_id``, no ``record``) is served unrecorded, and its
    ``GSPO-Recorded`` header says why (``gspo_rl.server.rollouts.serving.chat``)."""
    call = chat.prepare(body)
    with_usage = include_usage(body.stream_options) and bool(body.stream)  # checked either way
    if body.stream:
        streamed = await stream_chat(chat, body, call, with_usage)
        if call.plain:
            streamed.headers[RECORDED_HEADER] = PLAIN_CALL_NOTE
        return streamed
    if call.plain:
        response.headers[RECORDED_HEADER] = PLAIN_CALL_NOTE
    return await chat.create(body, call)
