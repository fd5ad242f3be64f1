"""Chat completions below HTTP: the options a request may use, its prompt through the chat
template, its completions parsed (reasoning, tool calls) and shaped as OpenAI choices.

A plain call (one sample, no ``rollout_id``, no ``"record"``: what an OpenAI tool sends) is
served unrecorded (``plain_call``): recorded, it would be a one-sample group, which never
trains (no spread of rewards) yet stays open until its deadline and counts against
admission. The response says so in its ``GSPO-Recorded`` header (``PLAIN_CALL_NOTE``);
``"record": true`` records it anyway.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from gspo_rl.server.config import ServerSettings
from gspo_rl.server.rollouts.chat.render import approx_chars, off_loop_if_large
from gspo_rl.server.rollouts.chat.render import render_chat_prompt as render
from gspo_rl.server.rollouts.errors import invalid
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
    GroupResult,
    Sample,
    check_prompt_ids,
    reject_unsupported,
)
from gspo_rl.server.rollouts.service import SamplingService
from gspo_rl.server.rollouts.serving.formatting import chat_logprobs, response_id, usage

RECORDED_HEADER = "GSPO-Recorded"
PLAIN_CALL_NOTE = ("false; a chat call with one sample and no rollout_id is served "
                   "unrecorded (a one-sample group never trains); to record it for training, "
                   "send n >= 2, an episode's rollout_id or \"record\": true")


def plain_call(rollout_id: object, n: object, record_given: bool) -> bool:
    """A chat call served unrecorded: one sample (``n`` 1 or unset), no ``rollout_id``, no
    ``record`` in the body (the module docstring says why)."""
    return rollout_id is None and n in (None, 1) and not record_given


def check_chat_options(body: ChatCompletionRequest) -> tuple[bool, int]:
    """Rejects what this server cannot honour; returns (parse tool calls?, top_logprobs)."""
    reject_unsupported(presence_penalty=body.presence_penalty,
                       frequency_penalty=body.frequency_penalty, logit_bias=body.logit_bias)
    if body.rollout_id is not None and not body.record:
        raise invalid("a turn of an episode (rollout_id) is always recorded: drop "
                      "\"record\": false, or send the conversation without rollout_id to "
                      "sample it unrecorded", code="invalid_parameter")
    if body.top_logprobs and not body.logprobs:
        raise invalid("top_logprobs needs logprobs=true", code="invalid_parameter")
    fmt = (body.response_format or {}).get("type", "text")
    if fmt != "text":
        raise invalid(f"response_format {fmt!r} is not supported: only 'text'",
                      code="unsupported_parameter")
    choice = body.tool_choice
    if choice not in (None, "auto", "none"):
        raise invalid(f"tool_choice {choice!r} is not supported: 'auto' or 'none' (the "
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
    return ChatCompletionResponse(id=response_id("chatcmpl-", result), created=int(time.time()),
                                  model=svc.model_name, choices=choices,
                                  usage=usage(result), group_id=result.group_id)
