"""From a validated request to recorded rollouts: limits, sampling parameters, fan-out, Redis.

Every sampling route runs the same three steps, in this order:

1. ``plan_generation``: every check that can fail because of the request (model name, limits,
   context length, token ids) runs here, before the engine or Redis is touched: a 4xx leaves
   nothing behind.
2. ``sample_group``: the ``n`` samples run concurrently; the engine batches them with
   everything else in flight. An aborted sample (engine shutting down) fails the request with
   a 503 and nothing is recorded.
3. the group and its ``n`` rollouts are written to Redis (``store.record_group``: the group
   opened and its rollouts recorded in one round trip) before the response leaves, so an
   environment that has a ``rollout_id`` can always post its reward. A plan with
   ``record=False`` (``"record": false``) skips this step: nothing is written, the samples
   have no ids (``unrecorded_result``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from gspo_rl.contract.schema import RolloutRecord, member_rollout_id
from gspo_rl.redisq.groups.store import RolloutStore
from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.errors import EngineUnavailable, RequestRefused
from gspo_rl.server.engines.sampler import Completion, SamplingEngine, SamplingParams
from gspo_rl.server.metrics import ServerMetrics
from gspo_rl.server.rollouts.errors import invalid, not_found, unavailable
from gspo_rl.server.rollouts.limits import MAX_STOP_STRINGS, MIN_TEMPERATURE
from gspo_rl.server.rollouts.protocol.base import SamplingFields


@dataclass(frozen=True)
class GenerationPlan:
    """A fully validated request: what to sample, how often, and what to store with it."""

    prompt_token_ids: list[int]
    params: SamplingParams
    n: int
    metadata: dict[str, Any]
    route: str
    record: bool = True
    """False: served, not recorded (``SamplingFields.record``)."""


@dataclass
class Sample:
    rollout_id: str | None  # None: not recorded
    completion: Completion


@dataclass
class GroupResult:
    """One request's samples, recorded in Redis as group ``group_id`` (None: not recorded)."""

    group_id: str | None
    prompt_token_ids: list[int]
    samples: list[Sample]

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.completion.token_ids) for s in self.samples)


def check_model(requested: str | None, settings: ServerSettings,
                served: str | None = None) -> None:
    """404 for a model this server does not serve (None: the native route's "any");
    ``served``: ``settings.model_name`` when the caller has it already."""
    served = settings.model_name if served is None else served
    if requested is not None and requested != served:
        raise not_found(f"model {requested!r} not found: this server serves "
                        f"{served!r}", code="model_not_found")


def check_prompt_ids(ids: list[int], vocab_size: int) -> list[int]:
    if not ids:
        raise invalid("the prompt is empty: send at least one token",
                      code="empty_prompt")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise invalid(f"token id {bad} is outside the vocabulary [0, {vocab_size})",
                       code="invalid_token_id")
    return ids


def _stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}",
                      code="too_many_stop_strings")
    if any(not s for s in stops):
        raise invalid("stop strings must not be empty", code="empty_stop_string")
    return tuple(stops)


def resolve_max_tokens(requested: int | None, prompt_len: int, engine: SamplingEngine,
                       settings: ServerSettings) -> int:
    """The request's max_tokens, checked against the cap and the context; None: the most
    both allow."""
    room = engine.max_model_len - prompt_len
    if room < 1:
        raise invalid(f"the prompt is {prompt_len} tokens; the model's context is "
                      f"{engine.max_model_len} tokens, which leaves no room to generate",
                      code="context_length_exceeded")
    if requested is None:
        return min(settings.max_tokens, room)
    if requested > settings.max_tokens:
        raise invalid(f"max_tokens {requested} is over this server's limit of "
                      f"{settings.max_tokens}", code="max_tokens_too_large")
    if requested > room:
        raise invalid(f"the prompt ({prompt_len} tokens) plus max_tokens ({requested}) "
                      f"is {prompt_len + requested} tokens, over the model's context of "
                      f"{engine.max_model_len} tokens", code="context_length_exceeded")
    return requested


def plan_generation(
    body: SamplingFields,
    *,
    prompt_token_ids: list[int],
    max_tokens: int | None,
    top_logprobs: int,
    stop_token_ids: tuple[int, ...],
    engine: SamplingEngine,
    settings: ServerSettings,
    route: str,
) -> GenerationPlan:
    """Checks every limit and builds the engine's sampling parameters."""
    if body.n > settings.max_n:
        raise invalid(f"n {body.n} is over this server's limit of {settings.max_n}",
                      code="n_too_large")
    for name in ("max_tokens", "max_completion_tokens"):  # both, whichever one is used
        value = getattr(body, name, None)
        if value is not None and value > settings.max_tokens:
            raise invalid(f"{name} {value} is over this server's limit of "
                          f"{settings.max_tokens}", code="max_tokens_too_large")
    if body.temperature is not None and body.temperature < MIN_TEMPERATURE and body.record:
        raise invalid(f"temperature {body.temperature:g} (greedy decoding, or as good as) is "
                      "refused for a recorded request: greedy tokens come from no distribution "
                      "the learner can compute log-probabilities under; send a temperature >= "
                      f"{MIN_TEMPERATURE:g} (e.g. 1.0, or omit it), or \"record\": false to "
                      "sample without training (evaluation)", code="temperature_zero")
    if top_logprobs > settings.max_top_logprobs:
        raise invalid(f"top_logprobs {top_logprobs} is over this server's limit of "
                      f"{settings.max_top_logprobs}", code="top_logprobs_too_large")
    params = SamplingParams(
        max_tokens=resolve_max_tokens(max_tokens, len(prompt_token_ids), engine, settings),
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(body.top_k or 0, 0),
        stop=_stop_strings(body.stop),
        stop_token_ids=() if body.ignore_eos else stop_token_ids,
        seed=body.seed,
        top_logprobs=top_logprobs,
    )
    return GenerationPlan(prompt_token_ids=prompt_token_ids, params=params, n=body.n,
                          metadata=dict(body.metadata or {}), route=route,
                          record=body.record)


def sample_params(plan: GenerationPlan) -> list[SamplingParams]:
    """Each sample's parameters: with a seed, sample i uses seed + i."""
    return [plan.params if plan.params.seed is None
            else dataclasses.replace(plan.params, seed=plan.params.seed + i)
            for i in range(plan.n)]


def engine_error(exc: BaseException) -> BaseException:
    """What an engine's typed failure of ``generate`` (``gspo_rl.server.engines.errors``)
    becomes for the client; anything else stays itself (a 500: the server's fault, never
    reported as the client's)."""
    if isinstance(exc, RequestRefused):  # the engine refused the request: a check above missed it
        return invalid(f"the engine refused the request: {exc}", code="invalid_request")
    if isinstance(exc, EngineUnavailable):  # the engine is stopped or its scheduler failed
        return unavailable(f"the engine cannot generate: {exc}", code="engine_unavailable",
                           retry_after_s=1)
    return exc


def check_not_aborted(completions: list[Completion]) -> None:
    if any(c.finish_reason == "abort" for c in completions):
        raise unavailable("generation was aborted (the engine is shutting down or "
                          "restarting); nothing was recorded, retry",
                          code="generation_aborted", retry_after_s=1)


async def generate_n(engine: SamplingEngine, plan: GenerationPlan) -> list[Completion]:
    """The plan's n samples, concurrently (the engine batches them). With a seed, sample i
    uses seed + i. If one fails, the others are cancelled."""
    params = sample_params(plan)
    if len(params) == 1:  # one sample: awaited as it is, no task to create and schedule
        try:
            completions = [await engine.generate(plan.prompt_token_ids, params[0])]
        except (RequestRefused, EngineUnavailable) as exc:
            raise engine_error(exc) from exc
    else:
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(engine.generate(plan.prompt_token_ids, p))
                         for p in params]
        except* (RequestRefused, EngineUnavailable) as eg:
            raise engine_error(eg.exceptions[0]) from eg
        completions = [t.result() for t in tasks]
    check_not_aborted(completions)
    return completions


def rollout_record(group_id: str, sample: Sample, prompt_token_ids: list[int],
                   params: SamplingParams, metadata: dict[str, Any]) -> RolloutRecord:
    """A single-turn rollout: prompt (mask 0) then the sampled completion (mask 1)."""
    c = sample.completion
    p, n = len(prompt_token_ids), len(c.token_ids)
    return RolloutRecord(
        rollout_id=cast(str, sample.rollout_id),  # recorded: it has an id
        group_id=group_id,
        token_ids=np.asarray(prompt_token_ids + c.token_ids, dtype=np.int32),
        loss_mask=np.concatenate([np.zeros(p, np.uint8), np.ones(n, np.uint8)]),
        logprobs=np.concatenate([np.zeros(p, np.float32), np.asarray(c.logprobs, np.float32)]),
        versions=np.concatenate([np.full(p, -1, np.int32),
                                 np.asarray(c.policy_versions, np.int32)]),
        prompt_len=p,
        temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
        turns=[(p, p + n)],
        finish_reason=c.finish_reason,
        created_at=time.time(),
        metadata=metadata,
    )


async def sample_group(engine: SamplingEngine, store: RolloutStore, plan: GenerationPlan,
                       metrics: ServerMetrics, server_id: str) -> GroupResult:
    """Samples the plan, records the group and its rollouts (unless ``plan.record`` is
    False), returns them."""
    start = time.perf_counter()
    completions = await generate_n(engine, plan)
    if not plan.record:
        return unrecorded_result(plan, completions, metrics, started=start)
    return await record_samples(store, plan, completions, metrics, server_id,
                                group_id=uuid.uuid4().hex, started=start)


def unrecorded_result(plan: GenerationPlan, completions: list[Completion],
                      metrics: ServerMetrics, *, started: float) -> GroupResult:
    """Finished samples of a ``record: false`` request: no ids, nothing written."""
    metrics.generation_latency.labels(plan.route).observe(time.perf_counter() - started)
    metrics.unrecorded.labels(plan.route).inc()
    result = GroupResult(group_id=None, prompt_token_ids=plan.prompt_token_ids,
                         samples=[Sample(rollout_id=None, completion=c) for c in completions])
    metrics.record_usage(plan.route, len(plan.prompt_token_ids), result.completion_tokens)
    return result


async def record_samples(store: RolloutStore, plan: GenerationPlan,
                         completions: list[Completion], metrics: ServerMetrics,
                         server_id: str, *, group_id: str, started: float) -> GroupResult:
    """Records finished samples as group ``group_id`` (streamed or not: the same record)."""
    metrics.generation_latency.labels(plan.route).observe(time.perf_counter() - started)
    # ids that name their group: its records key and its hash are all Redis keeps of them
    samples = [Sample(rollout_id=member_rollout_id(group_id, i), completion=c)
               for i, c in enumerate(completions)]
    record_meta = {"server_id": server_id, "route": plan.route}
    await store.record_group(group_id, plan.n, plan.metadata,
                             [rollout_record(group_id, s, plan.prompt_token_ids, plan.params,
                                             record_meta)
                              for s in samples])  # one round trip for the group
    metrics.groups.inc()
    metrics.rollouts.inc(len(samples))
    result = GroupResult(group_id=group_id, prompt_token_ids=plan.prompt_token_ids,
                         samples=samples)
    metrics.record_usage(plan.route, len(plan.prompt_token_ids), result.completion_tokens)
    return result


def first_version(completion: Completion, engine: SamplingEngine) -> int:
    """The version that sampled the first token (an empty completion: the current one)."""
    return completion.policy_versions[0] if completion.policy_versions else (
        engine.policy_version)


def reject_unsupported(*, presence_penalty: float | None, frequency_penalty: float | None,
                       logit_bias: dict | None) -> None:
    """OpenAI options this server does not implement: refused, never silently ignored (a
    penalty that is quietly dropped would make the samples differ from what was asked)."""
    for name, value in (("presence_penalty", presence_penalty),
                        ("frequency_penalty", frequency_penalty)):
        if value:
            raise invalid(f"{name} is not supported (it would change the sampled "
                          "distribution away from the policy's): send 0 or omit it",
                          code="unsupported_parameter")
    if logit_bias:
        raise invalid("logit_bias is not supported: omit it",
                      code="unsupported_parameter")
