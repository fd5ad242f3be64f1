"""``POST /v1/completions``: OpenAI legacy completions over raw text or token ids.

A prompt of token ids is passed to the engine untouched (no re-tokenisation): environments
that hold a token trajectory continue it exactly. One prompt per request: a request is one
group of ``n`` samples of one prompt. The work is ``CompletionServing``'s
(``gspo_rl.server.rollouts.serving.completions``).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from starlette.responses import StreamingResponse

from gspo_rl.server.api.deps import CompletionsDep, admit_new_group
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.api.streaming.serve import stream_completion
from gspo_rl.server.api.streaming.sse import SSE_RESPONSE_DOC, include_usage
from gspo_rl.server.rollouts.protocol.completions import CompletionRequest, CompletionResponse

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", response_model=CompletionResponse,
             dependencies=[Depends(admit_new_group)],
             responses={**error_responses(*V1_POST, 404), **SSE_RESPONSE_DOC})
async def completions(body: CompletionRequest,
                      serving: CompletionsDep) -> CompletionResponse | StreamingResponse:
    """Samples ``n`` continuations; each is recorded in Redis as one rollout of a group.
    With ``stream: true`` the continuations are sent as server-sent events as they are
    generated, and recorded before their final chunks (``gspo_rl.server.api.streaming.sse``)."""
    top_k = serving.prepare(body)
    with_usage = include_usage(body.stream_options) and bool(body.stream)  # checked either way
    if body.stream:
        return await stream_completion(serving, body, top_k, with_usage)
    return await serving.create(body, top_k)
