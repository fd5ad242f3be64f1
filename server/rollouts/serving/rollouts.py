"""Native rollouts below HTTP: one prompt (text, messages or token ids) sampled ``n`` times as
one group, shaped as the native response. ``RolloutServing`` (one per app) runs a request."""

from __future__ import annotations

from typing import Any

from gspo_rl.server.config import ServerSettings
from gspo_rl.server.rollouts.chat.render import approx_chars, off_loop_if_large, render_chat_prompt
from gspo_rl.server.rollouts.errors import invalid
from gspo_rl.server.rollouts.protocol.rollouts import RolloutOut, RolloutRequest, RolloutResponse
from gspo_rl.server.rollouts.sampling import GroupResult, check_prompt_ids
from gspo_rl.server.rollouts.service import SamplingService
from gspo_rl.server.rollouts.serving.formatting import rollout_top_logprobs, shown_all, usage

ROUTE = "rollouts"


async def rollout_prompt(body: RolloutRequest, tokenizer: Any,
                         settings: ServerSettings) -> list[int]:
    given = [name for name in ("prompt", "messages", "prompt_token_ids")
             if getattr(body, name) is not None]
    if len(given) != 1:
        raise invalid("send exactly one of prompt, messages, prompt_token_ids (got "
                      f"{', '.join(given) or 'none'})", code="invalid_prompt")
    if "tools" in body.model_fields_set and body.messages is None:
        raise invalid("tools need messages (they are rendered by the chat template)",
                      code="invalid_prompt")
    if body.messages is not None:
        if not body.messages:
            raise invalid("messages is empty", code="empty_prompt")
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        ids = await off_loop_if_large(approx_chars([messages, tools]), render_chat_prompt,
                                      tokenizer, messages, tools,
                                      settings.sanitize_control_tokens)
    elif body.prompt is not None:
        ids = await off_loop_if_large(len(body.prompt), tokenizer.encode, body.prompt)
    else:
        ids = list(body.prompt_token_ids or [])
    return check_prompt_ids(ids, len(tokenizer))


def rollout_response(result: GroupResult, body: RolloutRequest,
                     svc: SamplingService) -> RolloutResponse:
    stop_ids = svc.stop_token_ids()
    out = [
        RolloutOut(
            rollout_id=s.rollout_id, text=svc.text(s.completion, stop_ids),
            token_ids=s.completion.token_ids, logprobs=shown_all(s.completion.logprobs),
            policy_version=svc.first_version(s.completion),
            policy_versions=s.completion.policy_versions,
            finish_reason=s.completion.finish_reason,
            top_logprobs=(rollout_top_logprobs(svc.texts, s.completion, body.top_logprobs)
                          if body.top_logprobs else None),
        )
        for s in result.samples
    ]
    return RolloutResponse(group_id=result.group_id, model=svc.model_name,
                           prompt_token_ids=result.prompt_token_ids, rollouts=out,
                           usage=usage(result))


class RolloutServing:
    """``POST /v1/rollouts`` below HTTP; one per app (``app.state.serving_rollouts``)."""

    def __init__(self, svc: SamplingService) -> None:
        self.svc = svc

    async def create(self, body: RolloutRequest) -> RolloutResponse:
        """Checks the model, samples the group of ``n``, records it, shapes the response."""
        self.svc.check_model(body.model)
        prompt_ids = await rollout_prompt(body, self.svc.tokenizer, self.svc.settings)
        result = await self.svc.sample(body, prompt_ids, max_tokens=body.max_tokens,
                                       top_logprobs=body.top_logprobs, route=ROUTE)
        return rollout_response(result, body, self.svc)
