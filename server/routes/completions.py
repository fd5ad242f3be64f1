"""``POST /v1/completions``: OpenAI legacy completions over raw text or token ids.

A prompt of token ids is passed to the engine untouched (no re-tokenisation): environments
that hold a token trajectory continue it exactly. One prompt per request: a request is one
group of ``n`` samples of one prompt.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends

from server.admission import admit_new_group
from server.api_models import CompletionChoice, CompletionRequest, CompletionResponse
from server.chat import completion_text, end_token_ids, off_loop_if_large
from server.deps import (
    EngineDep,
    MetricsDep,
    SettingsDep,
    StoreDep,
    TokenizerDep,
    TokenTextsDep,
)
from server.error_docs import V1_POST, error_responses
from server.errors import APIError
from server.formatting import completion_logprobs, usage
from server.sampling import (
    check_model,
    check_prompt_ids,
    first_version,
    plan_generation,
    reject_unsupported,
    sample_group,
)

router = APIRouter(tags=["completions"])
ROUTE = "completions"


def check_completion_options(body: CompletionRequest) -> int:
    """Rejects what this server cannot honour; returns the number of top log-probs."""
    reject_unsupported(stream=body.stream, presence_penalty=body.presence_penalty,
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
             responses=error_responses(*V1_POST, 404))
async def completions(
    body: CompletionRequest, settings: SettingsDep, engine: EngineDep, store: StoreDep,
    tokenizer: TokenizerDep, texts: TokenTextsDep, metrics: MetricsDep,
) -> CompletionResponse:
    """Samples ``n`` continuations; each is recorded in Redis as one rollout of a group."""
    check_model(body.model, settings)
    top_k = check_completion_options(body)
    prompt_ids = await completion_prompt(body.prompt, tokenizer)
    stop_ids = end_token_ids(tokenizer)
    plan = plan_generation(body, prompt_token_ids=prompt_ids, max_tokens=body.max_tokens,
                           top_logprobs=top_k, stop_token_ids=stop_ids, engine=engine,
                           settings=settings, route=ROUTE)
    result = await sample_group(engine, store, plan, metrics, settings.server_id)
    choices = [
        CompletionChoice(
            index=i, text=completion_text(tokenizer, s.completion, stop_ids),
            finish_reason=s.completion.finish_reason,
            logprobs=(completion_logprobs(texts, s.completion, top_k)
                      if body.logprobs is not None else None),
            rollout_id=s.rollout_id, token_ids=s.completion.token_ids,
            prompt_token_ids=result.prompt_token_ids,
            policy_version=first_version(s.completion, engine),
            policy_versions=s.completion.policy_versions,
        )
        for i, s in enumerate(result.samples)
    ]
    return CompletionResponse(id=f"cmpl-{result.group_id}", created=int(time.time()),
                              model=settings.model_name, choices=choices,
                              usage=usage(result), group_id=result.group_id)
