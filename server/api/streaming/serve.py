"""``stream: true``, per route: a checked request, from its serving object
(``gspo_rl.server.rollouts.serving``) to the SSE response.

``stream_chat`` streams a new group (``ChatServing.plan``) or one more turn of an episode
(``ChatServing.plan_turn``, then ``commit_turn``); ``stream_completion`` streams a new group
(``CompletionServing.plan``). Both record exactly as the non-streamed request would
(``gspo_rl.server.api.streaming.group``) and send the route's chunks (``views``).
"""

from __future__ import annotations

import time

from starlette.responses import StreamingResponse

from gspo_rl.server.api.streaming.group import start_stream, stream_new_group
from gspo_rl.server.api.streaming.views import ChatView, CompletionView
from gspo_rl.server.engines.sampler import Completion
from gspo_rl.server.rollouts.protocol.chat import ChatCompletionRequest, ChatCompletionResponse
from gspo_rl.server.rollouts.protocol.completions import CompletionRequest
from gspo_rl.server.rollouts.sampling import GenerationPlan, GroupResult
from gspo_rl.server.rollouts.serving.chat import ChatCall, ChatServing
from gspo_rl.server.rollouts.serving.completions import CompletionServing


async def stream_chat(chat: ChatServing, body: ChatCompletionRequest, call: ChatCall,
                      with_usage: bool) -> StreamingResponse:
    """A chat request, streamed: a new group, or one more turn of an episode."""
    svc = chat.svc
    thinking = (body.chat_template_kwargs or {}).get("enable_thinking", True) is not False

    def view(plan: GenerationPlan) -> ChatView:
        return ChatView(svc.tokenizer, svc.texts, svc.stop_token_ids(), plan,
                        call.top_k if body.logprobs else None,
                        reasoning_parser=svc.settings.reasoning_parser, thinking=thinking,
                        with_tools=call.with_tools)

    def build(result: GroupResult) -> ChatCompletionResponse:
        return chat.response(result, body, call)

    if body.rollout_id is None:
        plan = await chat.plan(body, call)
        return await stream_new_group(svc, plan, view(plan), build, with_usage)
    turn = await chat.plan_turn(body, call)
    started = time.perf_counter()

    async def finish(completions: list[Completion]) -> ChatCompletionResponse:
        return await chat.commit_turn(turn, completions[0], body, call, started)

    return await start_stream(svc.engine, turn.plan, view(turn.plan),
                              group_id=turn.ep.group_id, model=svc.settings.model_name,
                              finish=finish, with_usage=with_usage)


async def stream_completion(completions: CompletionServing, body: CompletionRequest,
                            top_k: int, with_usage: bool) -> StreamingResponse:
    """A completions request, streamed: a new group."""
    svc = completions.svc
    plan = await completions.plan(body, top_k)
    view = CompletionView(svc.tokenizer, svc.texts, svc.stop_token_ids(), plan,
                          top_k if body.logprobs is not None else None)
    return await stream_new_group(svc, plan, view,
                                  lambda r: completions.response(r, body, top_k), with_usage)
