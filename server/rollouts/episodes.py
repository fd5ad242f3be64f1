"""Multi-turn episodes over the chat API: tokens in, tokens out, never re-tokenised.

An agent opens ``G`` episodes of one task (``POST /v1/groups``) and drives each with ordinary
chat completions that carry the episode's ``rollout_id``. The server keeps each episode's
token trajectory (``gspo_rl.redisq.episodes.store``): turn 1 renders the messages like
a single-turn chat call; turn k+1 repeats the whole conversation (the assistant messages as
the server returned them) plus new messages, and only the tokens that follow the model's turn
in the new rendering (the end-of-turn marker, the new messages, the generation prompt) are
appended. Earlier tokens, the model's own sampled ids above all, never change; the engine's
prompt for the turn is the stored trajectory plus the new tokens.

Rewritten history (a template that renders earlier turns differently) follows
``ServerSettings.episode_history_rewrite``: ``"append"`` (default; counted in
``metadata["history_rewrites"]``) or ``"reject"`` (409 ``history_rewritten``). Fixed per
episode (409 when a later turn changes them): the tools and the temperature; ``n`` must be 1.
Limits: ``max_episode_turns`` model turns, and the model's context. Episodes live as long as
their group: after its deadline they take no more turns (410). How the model's turn is found
in the new rendering, and why: docs/design/episodes.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from gspo_rl.contract.chat.messages import end_token_ids
from gspo_rl.contract.chat.turns import after_turn, count_eot
from gspo_rl.contract.schema import RolloutRecord
from gspo_rl.redisq.episodes.store import Episode, EpisodeState, EpisodeStore
from gspo_rl.redisq.groups.store import RolloutStore
from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.sampler import Completion, SamplingEngine, SamplingParams
from gspo_rl.server.metrics import ServerMetrics
from gspo_rl.server.rollouts.chat.render import (
    completion_text,
    render_chat_prompt,
    template_messages,
)
from gspo_rl.server.rollouts.errors import RolloutError, conflict, invalid, unsupported
from gspo_rl.server.rollouts.parsers import parse_assistant
from gspo_rl.server.rollouts.protocol.chat import ChatCompletionRequest
from gspo_rl.server.rollouts.sampling import (
    GenerationPlan,
    GroupResult,
    Sample,
    check_not_aborted,
    check_prompt_ids,
    generate_n,
    plan_generation,
)

ROUTE = "episode"


def _conflict(code: str, message: str) -> RolloutError:
    return conflict(message, code=code)


# ------------------------------------------------------------------ comparing messages
def digest(obj: Any) -> bytes:
    """16 bytes that identify a JSON-like value (messages are compared by digest, so an
    episode's state stays small whatever the conversation's length)."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).digest()[:16]


def _canonical_args(arguments: Any) -> str:
    """Tool-call arguments as canonical JSON (a string that is not JSON stays as it is)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def produced_message(content: str | None, calls: list[tuple[str, str]]) -> bytes:
    """The digest of the assistant message the server returned: its content and its tool
    calls' names and arguments (canonical JSON). Tool-call ids are not compared."""
    return digest({"content": content or "",
                   "tool_calls": [[name, _canonical_args(args)] for name, args in calls]})


def echoed_message(msg: dict[str, Any]) -> bytes:
    """The same digest of an assistant message sent back by the client (template form)."""
    calls = [(c.get("function") or {}) for c in msg.get("tool_calls") or []]
    return produced_message(msg.get("content"),
                            [(fn.get("name", ""), fn.get("arguments", "{}")) for fn in calls])


def check_extends(state: EpisodeState, messages: list[dict[str, Any]]) -> None:
    """The request must repeat the episode's history, then the assistant message the server
    produced, then at least one new message. 409 (400 for no new message) otherwise.
    ``messages`` are in template form
    (``gspo_rl.server.rollouts.chat.render.template_messages``)."""
    n = len(state.messages)
    if len(messages) <= n:
        raise _conflict("history_mismatch", (
            f"the episode's history is {n} message(s) plus the assistant turn the server "
            f"produced, but this request sends {len(messages)}: send the whole conversation "
            "(earlier messages unchanged, the assistant message as returned) and then the new "
            "messages"))
    for i, (old, new) in enumerate(zip(state.messages, messages, strict=False)):
        if old != digest(new):
            raise _conflict("history_mismatch", (
                f"messages[{i}] ({new.get('role')}) differs from the episode's history: "
                "earlier messages must be sent unchanged"))
    last = messages[n]
    if last.get("role") != "assistant" or echoed_message(last) != state.assistant:
        raise _conflict("history_mismatch", (
            f"messages[{n}] must be the assistant message this server produced in the "
            "episode's last turn, with its content and tool calls unchanged (got role "
            f"{last.get('role')!r})"))
    if len(messages) == n + 1:
        raise invalid("no new message after the episode's last assistant turn: add the "
                      "tool results or the user's reply", code="no_new_messages")


# ------------------------------------------------------------------ tokens
def ids_hash(ids: list[int]) -> bytes:
    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).digest()[:16]


def new_turn_tokens(full: list[int], state: EpisodeState, eot_ids: tuple[int, ...],
                    last_token: int | None) -> tuple[list[int], bool]:
    """What to append for a new turn, from the template's ``full`` rendering of the request;
    and whether that rendering extends the previous one (False: history was rewritten)."""
    extends = (len(full) >= state.render_len
               and ids_hash(full[:state.render_len]) == state.render_hash)
    new = after_turn(full, state.eot_count, set(eot_ids), last_token)
    if new is not None:
        return new, extends
    raise invalid("the chat template's rendering has no end-of-turn token after the "
                  "assistant turn, so the new messages cannot be located: this template "
                  "is not supported for multi-turn episodes",
                  code="unsupported_chat_template")


def grow_record(record: RolloutRecord, new_ids: list[int], c: Completion,
                params: SamplingParams, metadata: dict[str, Any]) -> RolloutRecord:
    """The trajectory with ``new_ids`` (mask 0) and the sampled completion (mask 1) appended."""
    start = len(record.token_ids) + len(new_ids)
    end = start + len(c.token_ids)
    n_new, n_c = len(new_ids), len(c.token_ids)
    return RolloutRecord(
        rollout_id=record.rollout_id, group_id=record.group_id,
        token_ids=np.concatenate([record.token_ids, np.asarray(new_ids, np.int32),
                                  np.asarray(c.token_ids, np.int32)]).astype(np.int32),
        loss_mask=np.concatenate([record.loss_mask, np.zeros(n_new, np.uint8),
                                  np.ones(n_c, np.uint8)]),
        logprobs=np.concatenate([record.logprobs, np.zeros(n_new, np.float32),
                                 np.asarray(c.logprobs, np.float32)]),
        versions=np.concatenate([record.versions, np.full(n_new, -1, np.int32),
                                 np.asarray(c.policy_versions, np.int32)]),
        prompt_len=record.prompt_len if record.turns else start,
        temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
        turns=[*record.turns, (start, end)],
        finish_reason=c.finish_reason, created_at=record.created_at, metadata=metadata,
    )


# ------------------------------------------------------------------ routes' entry points
def episode_store(store: RolloutStore) -> EpisodeStore:
    if not isinstance(store, EpisodeStore):
        raise unsupported("this server's store does not support multi-turn episodes",
                          code="episodes_unsupported")
    return store


async def open_episode_group(store: RolloutStore, size: int, metadata: dict[str, Any] | None,
                             server_id: str) -> tuple[str, list[str]]:
    """``POST /v1/groups``: a new group of ``size`` empty episodes; (group id, rollout ids)."""
    group_id = uuid.uuid4().hex
    rollout_ids = [uuid.uuid4().hex for _ in range(size)]
    await episode_store(store).open_episodes(
        group_id, rollout_ids, metadata, {"server_id": server_id, "route": ROUTE})
    return group_id, rollout_ids


def _check_turn_request(body: ChatCompletionRequest, ep: Episode, tools: Any,
                        temperature: float, settings: ServerSettings) -> None:
    if body.n != 1:
        raise invalid(f"n must be 1 on a chat completion with a rollout_id (got "
                      f"{body.n}): an episode is one conversation", code="invalid_n")
    if ep.n_turns >= settings.max_episode_turns:
        raise invalid(f"episode {ep.rollout_id!r} already has {ep.n_turns} model turns, "
                      f"this server's limit (max_episode_turns): post its reward",
                      code="episode_turn_limit")
    if ep.state is None:
        return
    if digest(tools) != ep.state.tools:
        raise _conflict("tools_changed", "tools differ from the episode's first turn: they are "
                                         "part of the prompt the model saw, keep them fixed")
    if temperature != ep.state.temperature:
        raise _conflict("temperature_changed", (
            f"temperature {temperature} differs from the episode's {ep.state.temperature}: "
            "an episode is trained at one temperature"))


def _check_same_cut(ep: Episode, params: SamplingParams) -> None:
    """top_p / top_k shape the distribution the learner recomputes, once per rollout (like
    the temperature): they stay those of the episode's first turn."""
    if ep.record.turns and (params.top_p, params.top_k) != (ep.record.top_p, ep.record.top_k):
        raise _conflict("sampling_changed", (
            f"top_p {params.top_p} / top_k {params.top_k} differ from the episode's "
            f"{ep.record.top_p} / {ep.record.top_k}: an episode is trained under one "
            "sampling distribution"))


async def _turn_prompt(body: ChatCompletionRequest, ep: Episode, raw: list[dict[str, Any]],
                       tools: Any, tokenizer: Any,
                       settings: ServerSettings) -> tuple[list[int], list[int], bool]:
    """(the full rendering, the tokens to append, whether the rendering extends the last)."""
    if ep.state is not None:
        check_extends(ep.state, template_messages(raw))
    # The assistant's own earlier messages are always encoded as text: their tokens come from
    # the stored trajectory, and a spelled end-of-turn marker must not shift the count below.
    full = await asyncio.to_thread(partial(
        render_chat_prompt, tokenizer, raw, tools, settings.sanitize_control_tokens,
        text_roles=("assistant",), template_kwargs=body.chat_template_kwargs))
    full = check_prompt_ids(full, len(tokenizer))
    if ep.state is None:
        return full, full, True
    last = int(ep.record.token_ids[-1]) if len(ep.record.token_ids) else None
    new_ids, extends = new_turn_tokens(full, ep.state, end_token_ids(tokenizer), last)
    if not extends and settings.episode_history_rewrite == "reject":
        raise _conflict("history_rewritten", (
            "the chat template renders the episode's earlier messages differently now "
            "(e.g. it drops earlier reasoning); this server rejects such turns "
            "(episode_history_rewrite='reject')"))
    return full, new_ids, extends


@dataclass
class PlannedTurn:
    """A checked turn, ready to sample (``plan``) and then to commit (``commit_turn``)."""

    plan: GenerationPlan
    ep: Episode
    raw: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    temperature: float
    full: list[int]  # the whole conversation's rendering
    new_ids: list[int]  # what the turn appends before the model's tokens
    extends: bool  # the rendering extends the previous one (no history rewrite)
    stop_ids: tuple[int, ...]


async def plan_turn(
    body: ChatCompletionRequest, *, store: RolloutStore, engine: SamplingEngine, tokenizer: Any,
    settings: ServerSettings, top_logprobs: int,
) -> PlannedTurn:
    """Every check of a turn of the episode ``body.rollout_id`` (a 4xx changes nothing) and
    its generation plan: the stored trajectory plus the new messages' tokens."""
    ep = await episode_store(store).load(body.rollout_id or "")
    raw = [m.model_dump(exclude_none=True) for m in body.messages]
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    temperature = 1.0 if body.temperature is None else body.temperature
    _check_turn_request(body, ep, tools, temperature, settings)
    full, new_ids, extends = await _turn_prompt(body, ep, raw, tools, tokenizer, settings)
    prompt = [*ep.record.token_ids.tolist(), *new_ids] if ep.state is not None else new_ids
    if len(prompt) >= engine.max_model_len:
        raise invalid(f"the episode's trajectory plus the new messages is {len(prompt)} "
                      f"tokens, which leaves no room to generate in the model's context "
                      f"of {engine.max_model_len} tokens: end the episode (post its "
                      "reward)", code="context_length_exceeded")
    stop_ids = end_token_ids(tokenizer)
    plan = plan_generation(
        body, prompt_token_ids=prompt, max_tokens=body.max_completion_tokens or body.max_tokens,
        top_logprobs=top_logprobs, stop_token_ids=stop_ids, engine=engine, settings=settings,
        route=ROUTE)
    _check_same_cut(ep, plan.params)
    return PlannedTurn(plan, ep, raw, tools, temperature, full, new_ids, extends, stop_ids)


async def commit_turn(
    turn: PlannedTurn, completion: Completion, body: ChatCompletionRequest, *,
    store: RolloutStore, tokenizer: Any, settings: ServerSettings, metrics: ServerMetrics,
    with_tools: bool, started: float,
) -> GroupResult:
    """Appends the sampled turn to its episode atomically (streamed or not: the same)."""
    check_not_aborted([completion])
    metrics.generation_latency.labels(ROUTE).observe(time.perf_counter() - started)
    ep, plan = turn.ep, turn.plan
    parsed = parse_assistant(
        completion_text(tokenizer, completion, turn.stop_ids),
        tool_parser=settings.tool_call_parser, reasoning_parser=settings.reasoning_parser,
        with_tools=with_tools, tools=turn.tools, template_kwargs=body.chat_template_kwargs)
    rewrites = (ep.state.history_rewrites if ep.state else 0) + (not turn.extends)
    state = EpisodeState(
        messages=[digest(m) for m in template_messages(turn.raw)],
        assistant=produced_message(parsed.content, [(t.name, t.arguments) for t in parsed.calls]),
        tools=digest(turn.tools), temperature=turn.temperature, render_len=len(turn.full),
        render_hash=ids_hash(turn.full),
        eot_count=count_eot(turn.full, set(turn.stop_ids)),
        history_rewrites=rewrites)
    meta = {"server_id": settings.server_id, "route": ROUTE, "history_rewrites": rewrites}
    await episode_store(store).commit_turn(
        ep, grow_record(ep.record, turn.new_ids, completion, plan.params, meta), state)
    metrics.record_usage(ROUTE, len(plan.prompt_token_ids), len(completion.token_ids))
    return GroupResult(group_id=ep.group_id, prompt_token_ids=plan.prompt_token_ids,
                       samples=[Sample(rollout_id=ep.rollout_id, completion=completion)])


async def episode_turn(
    body: ChatCompletionRequest, *, store: RolloutStore, engine: SamplingEngine, tokenizer: Any,
    settings: ServerSettings, metrics: ServerMetrics, top_logprobs: int, with_tools: bool,
) -> GroupResult:
    """One model turn of the episode ``body.rollout_id``: checked, sampled on the stored
    trajectory plus the new messages, appended atomically. Any 4xx leaves the episode as it
    was; so does a turn that loses a race with another turn of the same episode (409)."""
    turn = await plan_turn(body, store=store, engine=engine, tokenizer=tokenizer,
                           settings=settings, top_logprobs=top_logprobs)
    started = time.perf_counter()
    (completion,) = await generate_n(engine, turn.plan)
    return await commit_turn(turn, completion, body, store=store, tokenizer=tokenizer,
                             settings=settings, metrics=metrics, with_tools=with_tools,
                             started=started)
