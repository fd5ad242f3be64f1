"""Legacy completions below HTTP: the options a request may use, its one prompt as token ids,
its completions shaped as OpenAI choices. ``CompletionServing`` (one per app) runs a request:
``prepare`` checks it, ``create`` samples, records and shapes it; a streamed request is
planned (``plan``) and shaped (``response``) by ``gspo_rl.server.api.streaming.serve``."""

from __future__ import annotations

import time
from typing import Any

from gspo_rl.server.rollouts.chat.render import off_loop_if_large
from gspo_rl.server.rollouts.errors import invalid
from gspo_rl.server.rollouts.protocol.completions import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
)
from gspo_rl.server.rollouts.sampling import (
    GenerationPlan,
    GroupResult,
    check_prompt_ids,
    reject_unsupported,
)
from gspo_rl.server.rollouts.service import SamplingService
from gspo_rl.server.rollouts.serving.formatting import completion_logprobs, response_id, usage

ROUTE = "completions"


def check_completion_options(body: CompletionRequest) -> int:
    """Rejects what this server cannot honour; returns the number of top log-probs."""
    reject_unsupported(presence_penalty=body.presence_penalty,
                       frequency_penalty=body.frequency_penalty, logit_bias=body.logit_bias)
    if body.echo:
        raise invalid("echo=true is not supported: the response's prompt_token_ids "
                      "carry the prompt", code="unsupported_parameter")
    if body.suffix:
        raise invalid("suffix is not supported", code="unsupported_parameter")
    if body.best_of not in (None, 1):
        raise invalid("best_of is not supported (every sample is returned): omit it or "
                      "send 1", code="unsupported_parameter")
    return body.logprobs or 0


async def completion_prompt(prompt: Any, tokenizer: Any) -> list[int]:
    """Token ids of the one prompt: text is tokenised (with the tokenizer's special tokens,
    e.g. a BOS), token ids are taken as they are."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise invalid(f"got {len(prompt)} prompts: send one prompt per request "
                          "(n samples of it form one group)", code="batched_prompts")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = await off_loop_if_large(len(prompt), tokenizer.encode, prompt)
    else:
        ids = [int(t) for t in prompt]
    return check_prompt_ids(ids, len(tokenizer))


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
    return CompletionResponse(id=response_id("cmpl-", result), created=int(time.time()),
                              model=svc.model_name, choices=choices,
                              usage=usage(result), group_id=result.group_id)


class CompletionServing:
    """``POST /v1/completions`` below HTTP; one per app (``app.state.serving_completions``)."""

    def __init__(self, svc: SamplingService) -> None:
        self.svc = svc

    def prepare(self, body: CompletionRequest) -> int:
        """Checks the model and the options; returns the number of top log-probs."""
        self.svc.check_model(body.model)
        return check_completion_options(body)

    async def create(self, body: CompletionRequest, top_k: int) -> CompletionResponse:
        """Samples the prompt ``n`` times, records the group, shapes the response."""
        prompt_ids = await completion_prompt(body.prompt, self.svc.tokenizer)
        result = await self.svc.sample(body, prompt_ids, max_tokens=body.max_tokens,
                                       top_logprobs=top_k, route=ROUTE)
        return self.response(result, body, top_k)

    async def plan(self, body: CompletionRequest, top_k: int) -> GenerationPlan:
        """The request's checked generation, to stream."""
        prompt_ids = await completion_prompt(body.prompt, self.svc.tokenizer)
        return self.svc.plan(body, prompt_ids, max_tokens=body.max_tokens, top_logprobs=top_k,
                             route=ROUTE)

    def response(self, result: GroupResult, body: CompletionRequest,
                 top_k: int) -> CompletionResponse:
        return completion_response(result, body, self.svc, top_k)
