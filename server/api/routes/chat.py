"""``POST /v1/chat/completions``: OpenAI chat, with tool calls, recorded as a group of n.

The multi-turn seam: ``chat_prompt`` turns a request into prompt token ids and
``SamplingService.sample`` samples and records them as a new group. A multi-turn
episode (a request carrying the ``rollout_id`` of an episode opened with ``POST /v1/groups``)
swaps these two (``SamplingService.episode_turn``): the prompt is the episode's token
trajectory so far plus only the new messages' tokens, and the sample is appended to that
rollout as one more turn instead of opening a group.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from fastapi import APIRouter, Depends
from starlette.responses import StreamingResponse

from gspo_rl.server.api.deps import SamplingDep, admit_new_group
from gspo_rl.server.api.error_docs import V1_POST, error_responses
from gspo_rl.server.api.errors import APIError
from gspo_rl.server.api.formatting import chat_logprobs, usage
from gspo_rl.server.api.streaming.group import start_stream, stream_new_group
from gspo_rl.server.api.streaming.sse import SSE_RESPONSE_DOC, include_usage
from gspo_rl.server.api.streaming.views import ChatView
from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.base import Completion
from gspo_rl.server.rollouts.chat.render import approx_chars, off_loop_if_large
from gspo_rl.server.rollouts.chat.render import render_chat_prompt as render
from gspo_rl.server.rollouts.limits import check_chat_messages
from gspo_rl.server.rollouts.parsers import AssistantParse, parse_assistant
from gspo_rl.server.rollouts.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    FunctionCallOut,
    ToolCallOut,
)
from gspo_rl.server.rollouts.sampling import (
    GenerationPlan,
    GroupResult,
    Sample,
    check_prompt_ids,
    reject_unsupported,
)
from gspo_rl.server.rollouts.service import SamplingService

router = APIRouter(tags=["chat"])
ROUTE = "chat"


def check_chat_options(body: ChatCompletionRequest) -> tuple[bool, int]:
    """Rejects what this server cannot honour; returns (parse tool calls?, top_logprobs)."""
    reject_unsupported(presence_penalty=body.presence_penalty,
                       frequency_penalty=body.frequency_penalty, logit_bias=body.logit_bias)
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", code="invalid_parameter")
    fmt = (body.response_format or {}).get("type", "text")
    if fmt != "text":
        raise APIError(400, f"response_format {fmt!r} is not supported: only 'text'",
                       code="unsupported_parameter")
    choice = body.tool_choice
    if choice not in (None, "auto", "none"):
        raise APIError(400, f"tool_choice {choice!r} is not supported: 'auto' or 'none' (the "
                            "server does not constrain decoding)", code="unsupported_parameter")
    return bool(body.tools) and choice != "none", body.top_logprobs or 0


async def chat_prompt(body: ChatCompletionRequest, tokenizer: Any,
                      settings: ServerSettings) -> list[int]:
    """Prompt token ids for a chat request: the chat template over the messages and tools
    (in a worker thread when long: templating must not stall the event loop)."""
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    ids = await off_loop_if_large(approx_chars([messages, tools]), partial(
        render, template_kwargs=body.chat_template_kwargs), tokenizer, messages, tools,
        settings.sanitize_control_tokens)
    return check_prompt_ids(ids, len(tokenizer))


def parsed_completion(text: str, body: ChatCompletionRequest, settings: ServerSettings,
                      with_tools: bool) -> AssistantParse:
    """The completion's text as the client sees it (``gspo_rl.server.rollouts.parsers``)."""
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    return parse_assistant(text, tool_parser=settings.tool_call_parser,
                           reasoning_parser=settings.reasoning_parser, with_tools=with_tools,
                           tools=tools, template_kwargs=body.chat_template_kwargs)


def _choice(index: int, sample: Sample, prompt_ids: list[int], svc: SamplingService,
            parsed: AssistantParse, top_k: int | None) -> ChatChoice:
    c = sample.completion
    tool_calls = [ToolCallOut(id=t.id, function=FunctionCallOut(name=t.name,
                                                                arguments=t.arguments))
                  for t in parsed.calls] or None
    return ChatChoice(
        index=index,
        message=AssistantMessage(content=parsed.content, reasoning_content=parsed.reasoning,
                                 tool_calls=tool_calls),
        finish_reason="tool_calls" if tool_calls else c.finish_reason,
        logprobs=chat_logprobs(svc.texts, c, top_k) if top_k is not None else None,
        rollout_id=sample.rollout_id, token_ids=c.token_ids, prompt_token_ids=prompt_ids,
        policy_version=svc.first_version(c), policy_versions=c.policy_versions,
    )


def chat_response(result: GroupResult, body: ChatCompletionRequest, svc: SamplingService,
                  with_tools: bool, top_k: int) -> ChatCompletionResponse:
    k = top_k if body.logprobs else None
    stop_ids = svc.stop_token_ids()
    choices = [_choice(i, s, result.prompt_token_ids, svc,
                       parsed_completion(svc.text(s.completion, stop_ids), body, svc.settings,
                                         with_tools), k)
               for i, s in enumerate(result.samples)]
    return ChatCompletionResponse(id=f"chatcmpl-{result.group_id}", created=int(time.time()),
                                  model=svc.model_name, choices=choices,
                                  usage=usage(result), group_id=result.group_id)


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse,
             dependencies=[Depends(admit_new_group)],
             responses={**error_responses(*V1_POST, 404, 409, 410, 501), **SSE_RESPONSE_DOC})
async def chat_completions(body: ChatCompletionRequest,
                           svc: SamplingDep) -> ChatCompletionResponse | StreamingResponse:
    """Samples ``n`` assistant turns; each is recorded in Redis as one rollout of a group.
    With ``stream: true`` the turns are sent as server-sent events as they are generated,
    and recorded before their final chunks (``gspo_rl.server.api.streaming.sse``)."""
    svc.check_model(body.model)
    check_chat_messages(body.messages)
    with_tools, top_k = check_chat_options(body)
    with_usage = include_usage(body.stream_options) if body.stream else False
    if body.stream:
        return await stream_chat(body, svc, with_tools, top_k, with_usage)
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
