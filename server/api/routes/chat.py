"""``POST /v1/chat/completions``: OpenAI chat, with tool calls, recorded as a group of n.

The multi-turn seam: ``chat_prompt`` turns a request into prompt token ids and
``SamplingService.sample`` samples and records them as a new group. A multi-turn
episode (a request carrying the ``rollout_id`` of an episode opened with ``POST /v1/groups``)
swaps these two (``SamplingService.episode_turn``): the prompt is the episode's token
trajectory so far plus only the new messages' tokens, and the sample is appended to that
rollout as one more turn instead of opening a group.
"""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Depends, Response
from starlette.responses import StreamingResponse

from gspo_rl.server.api.deps import SamplingDep, admit_new_group
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.api.streaming.group import start_stream, stream_new_group
from gspo_rl.server.api.streaming.sse import SSE_RESPONSE_DOC, include_usage
from gspo_rl.server.api.streaming.views import ChatView
from gspo_rl.server.engines.base import Completion
from gspo_rl.server.rollouts.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from gspo_rl.server.rollouts.sampling import (
    GenerationPlan,
    GroupResult,
)
from gspo_rl.server.rollouts.service import SamplingService
from gspo_rl.server.rollouts.serving.chat import (
    PLAIN_CALL_NOTE,
    RECORDED_HEADER,
    chat_prompt,
    chat_response,
    check_chat_options,
    plain_call,
)

router = APIRouter(tags=["chat"])
ROUTE = "chat"
log = logging.getLogger(__name__)
_said: list[bool] = []


def _say_plain_calls_once() -> None:
    if not _said:
        _said.append(True)
        log.info("plain chat calls (one sample, no rollout_id, no \"record\") are served "
                 "unrecorded: a one-sample group never trains. Training traffic sends n >= 2 "
                 "or an episode's rollout_id; the GSPO-Recorded response header says so")


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse,
             dependencies=[Depends(admit_new_group)],
             responses={**error_responses(*V1_POST, 404, 409, 410, 501), **SSE_RESPONSE_DOC})
async def chat_completions(body: ChatCompletionRequest, svc: SamplingDep,
                           response: Response) -> ChatCompletionResponse | StreamingResponse:
    """Samples ``n`` assistant turns; each is recorded in Redis as one rollout of a group.
    With ``stream: true`` the turns are sent as server-sent events as they are generated,
    and recorded before their final chunks (``gspo_rl.server.api.streaming.sse``). A plain
    call (one sample, no ``rollout_id``, no ``record``) is served unrecorded, and its
    ``GSPO-Recorded`` header says why (``gspo_rl.server.rollouts.serving.chat``)."""
    svc.check_model(body.model)
    with_tools, top_k = check_chat_options(body)
    with_usage = include_usage(body.stream_options) and bool(body.stream)  # checked either way
    plain = plain_call(body.rollout_id, body.n, "record" in body.model_fields_set)
    if plain:
        body.record = False
        _say_plain_calls_once()
    if body.stream:
        streamed = await stream_chat(body, svc, with_tools, top_k, with_usage)
        if plain:
            streamed.headers[RECORDED_HEADER] = PLAIN_CALL_NOTE
        return streamed
    if plain:
        response.headers[RECORDED_HEADER] = PLAIN_CALL_NOTE
    if body.rollout_id is not None:  # one more turn of a multi-turn episode
        result = await svc.episode_turn(body, top_logprobs=top_k, with_tools=with_tools)
    else:
        prompt_ids = await chat_prompt(body, svc.tokenizer, svc.settings)
        result = await svc.sample(body, prompt_ids,
                                  max_tokens=body.max_completion_tokens or body.max_tokens,
                                  top_logprobs=top_k, route=ROUTE)
    return chat_response(result, body, svc, with_tools, top_k)


async def stream_chat(body: ChatCompletionRequest, svc: SamplingService, with_tools: bool,
                      top_k: int, with_usage: bool) -> StreamingResponse:
    """``stream: true``: a new group, or one more turn of an episode
    (``gspo_rl.server.api.streaming.sse``)."""
    thinking = (body.chat_template_kwargs or {}).get("enable_thinking", True) is not False

    def view(plan: GenerationPlan) -> ChatView:
        return ChatView(svc.tokenizer, svc.texts, svc.stop_token_ids(), plan,
                        top_k if body.logprobs else None,
                        reasoning_parser=svc.settings.reasoning_parser, thinking=thinking,
                        with_tools=with_tools)

    def build(result: GroupResult) -> ChatCompletionResponse:
        return chat_response(result, body, svc, with_tools, top_k)

    if body.rollout_id is None:
        prompt_ids = await chat_prompt(body, svc.tokenizer, svc.settings)
        plan = svc.plan(body, prompt_ids, max_tokens=body.max_completion_tokens or body.max_tokens,
                        top_logprobs=top_k, route=ROUTE)
        return await stream_new_group(svc, plan, view(plan), build, with_usage)
    turn = await svc.plan_turn(body, top_logprobs=top_k)
    started = time.perf_counter()

    async def finish(completions: list[Completion]) -> ChatCompletionResponse:
        return build(await svc.commit_turn(turn, completions[0], body, with_tools=with_tools,
                                           started=started))

    return await start_stream(svc.engine, turn.plan, view(turn.plan),
                              group_id=turn.ep.group_id, model=svc.settings.model_name,
                              finish=finish, with_usage=with_usage)
