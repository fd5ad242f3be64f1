"""Chat completions below HTTP: the options a request may use, its prompt through the chat
template, its completions parsed (reasoning, tool calls) and shaped as OpenAI choices.

``ChatServing`` (one per app) runs a request: ``prepare`` checks it, ``create`` samples and
records it (a new group of n, or one more turn of the multi-turn episode its ``rollout_id``
names: ``gspo_rl.server.rollouts.episodes``) and shapes the response; a streamed request
takes the same steps one at a time (``plan`` or ``plan_turn``, then ``response`` or
``commit_turn``: ``gspo_rl.server.api.streaming.serve``).

A plain call (one sample, no ``rollout_id``, no ``"record"``: what an OpenAI tool sends) is
served unrecorded (``plain_call``): recorded, it would be a one-sample group, which never
trains (no spread of rewards) yet stays open until its deadline and counts against
admission. The response says so in its ``GSPO-Recorded`` header (``PLAIN_CALL_NOTE``);
``"record": true`` records it anyway.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.sampler import Completion
from gspo_rl.server.rollouts.chat.render import approx_chars, off_loop_if_large
from gspo_rl.server.rollouts.chat.render import render_chat_prompt as render
from gspo_rl.server.rollouts.episodes import PlannedTurn
from gspo_rl.server.rollouts.errors import invalid
from gspo_rl.server.rollouts.parsers import AssistantParse, parse_assistant
from gspo_rl.server.rollouts.protocol.chat import (
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
from gspo_rl.server.rollouts.serving.formatting import chat_logprobs, response_id, usage

log = logging.getLogger(__name__)
ROUTE = "chat"
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


@dataclass(frozen=True)
class ChatCall:
    """What ``ChatServing.prepare`` found in a request."""

    with_tools: bool  # parse tool calls out of the completions
    top_k: int  # top log-probs per token
    plain: bool  # a plain call, served unrecorded (``PLAIN_CALL_NOTE`` says so)


class ChatServing:
    """``POST /v1/chat/completions`` below HTTP; one per app (``app.state.serving_chat``)."""

    def __init__(self, svc: SamplingService) -> None:
        self.svc = svc
        self._said_plain = False

    def prepare(self, body: ChatCompletionRequest) -> ChatCall:
        """Checks the model and the options; a plain call is marked unrecorded."""
        self.svc.check_model(body.model)
        with_tools, top_k = check_chat_options(body)
        plain = plain_call(body.rollout_id, body.n, "record" in body.model_fields_set)
        if plain:
            body.record = False
            self._say_plain_calls_once()
        return ChatCall(with_tools, top_k, plain)

    async def create(self, body: ChatCompletionRequest, call: ChatCall) -> ChatCompletionResponse:
        """Samples and records the request (a new group, or one more turn of an episode)."""
        if body.rollout_id is not None:
            result = await self.svc.episode_turn(body, top_logprobs=call.top_k,
                                                 with_tools=call.with_tools)
        else:
            prompt_ids = await chat_prompt(body, self.svc.tokenizer, self.svc.settings)
            result = await self.svc.sample(
                body, prompt_ids, max_tokens=body.max_completion_tokens or body.max_tokens,
                top_logprobs=call.top_k, route=ROUTE)
        return self.response(result, body, call)

    async def plan(self, body: ChatCompletionRequest, call: ChatCall) -> GenerationPlan:
        """A new group's checked generation, to stream."""
        prompt_ids = await chat_prompt(body, self.svc.tokenizer, self.svc.settings)
        return self.svc.plan(body, prompt_ids,
                             max_tokens=body.max_completion_tokens or body.max_tokens,
                             top_logprobs=call.top_k, route=ROUTE)

    async def plan_turn(self, body: ChatCompletionRequest, call: ChatCall) -> PlannedTurn:
        """An episode's checked next turn, to stream."""
        return await self.svc.plan_turn(body, top_logprobs=call.top_k)

    async def commit_turn(self, turn: PlannedTurn, completion: Completion,
                          body: ChatCompletionRequest, call: ChatCall,
                          started: float) -> ChatCompletionResponse:
        """Appends a streamed turn to its episode; the non-streamed response."""
        result = await self.svc.commit_turn(turn, completion, body,
                                            with_tools=call.with_tools, started=started)
        return self.response(result, body, call)

    def response(self, result: GroupResult, body: ChatCompletionRequest,
                 call: ChatCall) -> ChatCompletionResponse:
        return chat_response(result, body, self.svc, call.with_tools, call.top_k)

    def _say_plain_calls_once(self) -> None:
        if not self._said_plain:
            self._said_plain = True
            log.info("plain chat calls (one sample, no rollout_id, no \"record\") are served "
                     "unrecorded: a one-sample group never trains. Training traffic sends "
                     "n >= 2 or an episode's rollout_id; the GSPO-Recorded response header "
                     "says so")
