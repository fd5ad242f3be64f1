"""What every sampling body and response shares: the OpenAI body's leniency, the sampling
fields, the schema keywords of the refused OpenAI options, and the RL extension fields of
one choice (``rollout_id``, ``token_ids``, ``policy_version``, ``policy_versions``).

OpenAI bodies (``OpenAIBody``) ignore unknown fields; every body is strict (``"n": "2"`` is a
422, not 2: ``gspo_rl.server.rollouts.fields``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from gspo_rl.server.rollouts.fields import doc_only, int_in
from gspo_rl.server.rollouts.limits import MAX_STOP_STRINGS, MIN_TEMPERATURE, Metadata


class OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class SamplingFields(BaseModel):
    """Fields every sampling route shares. None: the server's default. ``n``, ``max_tokens``
    and the top log-probs are bounded by the server's settings (its ``/openapi.json`` says
    by how much: ``gspo_rl.server.api.openapi``)."""

    model_config = ConfigDict(strict=True)

    n: int_in(ge=1) = 1  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    temperature: Annotated[float | None, doc_only(minimum=MIN_TEMPERATURE)] = Field(
        default=None, ge=0.0, le=2.0)
    """At least 0.001 for a recorded request: 0 (greedy) is refused (400), greedy tokens come
    from no distribution the learner could train under. Any value with ``record: false``."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int_in(ge=-1) | None = None  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    """vLLM extension; 0 or -1: off. ``top_p`` / ``top_k`` are recorded with the rollout and
    the learner trains under the same truncated distribution."""
    max_tokens: int_in(ge=1) | None = None  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    stop: Annotated[str | list[str] | None, doc_only(
        minLength=1, maxItems=MAX_STOP_STRINGS, items={"type": "string", "minLength": 1})] = None
    """At most 16 strings, none empty."""
    seed: int_in(ge=-(2**63), lt=2**63 - 2**16) | None = None  # type: ignore[valid-type]  # int_in: an Annotated type made at run time
    """With n > 1, sample i uses seed + i: n copies of one sample would carry no signal."""
    ignore_eos: bool = False
    """vLLM extension: do not stop at EOS / end of turn (benchmarks, fixed-length rollouts)."""
    metadata: Metadata | None = None
    """Stored with the group in Redis (the environment's task id, answer key, ...)."""
    record: bool = True
    """Extension. false: serve the request without recording it (evaluation, inference): no
    group, no admission, nothing written to Redis, nothing trained; served also after the
    learner's target (no 503 ``training_finished``). Token ids, log-probabilities and policy
    versions come back as usual; ``group_id`` and ``rollout_id`` are null."""


# What the rollout layer refuses of the OpenAI options, as schema keywords (doc_only).
NO_PENALTY = doc_only(minimum=0, maximum=0)
NO_LOGIT_BIAS = doc_only(maxProperties=0)
STREAM_OPTIONS = doc_only(properties={"include_usage": {"type": "boolean"}})


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class RLFields(BaseModel):
    """The RL extension fields of one choice / rollout."""

    rollout_id: str | None
    """The recorded rollout the reward goes to (null: ``record: false``)."""
    token_ids: list[int]
    policy_version: int
    policy_versions: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]
