"""``POST /v1/completions``: OpenAI legacy completions over raw text or token ids.

A prompt of token ids is passed to the engine untouched (no re-tokenisation): environments
that hold a token trajectory continue it exactly. One prompt per request: a request is one
group of ``n`` samples of one prompt.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from starlette.responses import StreamingResponse

from gspo_rl.server.api.deps import SamplingDep, admit_new_group
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.api.streaming.group import stream_new_group
from gspo_rl.server.api.streaming.sse import SSE_RESPONSE_DOC, include_usage
from gspo_rl.server.api.streaming.views import CompletionView
from gspo_rl.server.rollouts.protocol import CompletionRequest, CompletionResponse
from gspo_rl.server.rollouts.serving.completions import (
    check_completion_options,
    completion_prompt,
    completion_response,
)

router = APIRouter(tags=["completions"])
ROUTE = "completions"


@router.post("/v1/completions", response_model=CompletionResponse,
             dependencies=[Depends(admit_new_group)],
             responses={**error_responses(*V1_POST, 404), **SSE_RESPONSE_DOC})
async def completions(body: CompletionRequest,
                      svc: SamplingDep) -> CompletionResponse | StreamingResponse:
    """Samples ``n`` continuations; each is recorded in Redis as one rollout of a group.
    With ``stream: true`` the continuations are sent as server-sent events as they are
    generated, and recorded before their final chunks (``gspo_rl.server.api.streaming.sse``)."""
    svc.check_model(body.model)
    top_k = check_completion_options(body)
    with_usage = include_usage(body.stream_options) and bool(body.stream)  # checked either way
    prompt_ids = await completion_prompt(body.prompt, svc.tokenizer)
    if body.stream:
        plan = svc.plan(body, prompt_ids, max_tokens=body.max_tokens, top_logprobs=top_k,
                        route=ROUTE)
        view = CompletionView(svc.tokenizer, svc.texts, svc.stop_token_ids(), plan,
                              top_k if body.logprobs is not None else None)
        return await stream_new_group(svc, plan, view,
                                      lambda r: completion_response(r, body, svc, top_k),
                                      with_usage)
    result = await svc.sample(body, prompt_ids, max_tokens=body.max_tokens,
                              top_logprobs=top_k, route=ROUTE)
    return completion_response(result, body, svc, top_k)
