"""``POST /v1/completions``: OpenAI legacy completions over raw text or token ids.

A prompt of token ids is passed to the engine untouched (no re-tokenisation): environments
that hold a token trajectory continue it exactly. One prompt per request: a request is one
group of ``n`` samples of one prompt.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends
from starlette.responses import StreamingResponse

from gspo_rl.server.api.deps import SamplingDep, admit_new_group
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.api.errors import APIError
from gspo_rl.server.api.formatting import completion_logprobs, usage
from gspo_rl.server.api.streaming.group import stream_new_group
from gspo_rl.server.api.streaming.sse import SSE_RESPONSE_DOC, include_usage
from gspo_rl.server.api.streaming.views import CompletionView
from gspo_rl.server.rollouts.chat.render import off_loop_if_large
from gspo_rl.server.rollouts.protocol import CompletionChoice, CompletionRequest, CompletionResponse
from gspo_rl.server.rollouts.sampling import GroupResult, check_prompt_ids, reject_unsupported
from gspo_rl.server.rollouts.service import SamplingService

router = APIRouter(tags=["completions"])
ROUTE = "completions"


def check_completion_options(body: CompletionRequest) -> int:
    """Rejects what this server cannot honour; returns the number of top log-probs."""
    reject_unsupported(presence_penalty=body.presence_penalty,
                       frequency_penalty=body.frequency_penalty, logit_bias=body.logit_bias)
    if body.echo:
        raise APIError(400, "echo=true is not supported: the response's prompt_token_ids "
                            "carry the prompt", code="unsupported_parameter")
    if body.suffix:
        raise APIError(400, "suffix is not supported", code="unsupported_parameter")
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(400, "best_of is not supported (every sample is returned): omit it or "
                            "set it equal to n", code="unsupported_parameter")
    return body.logprobs or 0


async def completion_prompt(prompt: Any, tokenizer: Any) -> list[int]:
    """Token ids of the one prompt: text is tokenised (with the tokenizer's special tokens,
    e.g. a BOS), token ids are taken as they are."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise APIError(400, f"got {len(prompt)} prompts: send one prompt per request "
                                "(n samples of it form one group)", code="batched_prompts")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = await off_loop_if_large(len(prompt), tokenizer.encode, prompt)
    else:
        ids = [int(t) for t in prompt]
    return check_prompt_ids(ids, len(tokenizer))


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
    with_usage = include_usage(body.stream_options) if body.stream else False
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


def completion_response(result: GroupResult, body: CompletionRequest, svc: SamplingService,
                        top_k: int) -> CompletionResponse:
    stop_ids = svc.stop_token_ids()
    choices = [
        CompletionChoice(
            index=i, text=svc.text(s.completion, stop_ids),
            finish_reason=s.completion.finish_reason,
            logprobs=(completion_logprobs(svc.texts, s.completion, top_k)
                      if body.logprobs is not None else None),
            rollout_id=s.rollout_id, token_ids=s.completion.token_ids,
            prompt_token_ids=result.prompt_token_ids,
            policy_version=svc.first_version(s.completion),
            policy_versions=s.completion.policy_versions,
        )
        for i, s in enumerate(result.samples)
    ]
    return CompletionResponse(id=f"cmpl-{result.group_id}", created=int(time.time()),
                              model=svc.model_name, choices=choices,
                              usage=usage(result), group_id=result.group_id)
