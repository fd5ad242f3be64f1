"""The sampling half of the engine interface: what the rollout layer samples through.

One engine fronts one model. Requests are token ids in, token ids + log-probabilities out; the
server does all tokenisation and chat templating, so both engines see exactly the same tokens.

Log-probabilities are those of the distribution actually sampled from: after temperature
(``log_softmax(logits / temperature)``) and, when top-k / top-p are on, after truncation and
renormalisation, with vLLM's rule for the kept set (``gspo_rl.contract.sampling_dist.keep_mask``);
both engines say so in ``Engine.logprobs_after_truncation``. The rollout record stores the
temperature, top_p and top_k, and the learner computes its log-probabilities under the same
truncated distribution.

The values exchanged (``SamplingParams`` in; ``Completion``, ``Partial`` out; ``EngineStats``)
and ``validate_request``, every engine's one set of request checks, live here too.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Literal

import torch

from gspo_rl.server.engines.errors import RequestRefused

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one completion (one sample: the server fans out ``n``)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    stop: tuple[str, ...] = ()  # stop strings, matched on the decoded completion
    stop_token_ids: tuple[int, ...] = ()  # e.g. EOS / end-of-turn; the token is kept
    seed: int | None = None
    top_logprobs: int = 0  # also return the k most likely tokens at each step


@dataclass
class Completion:
    """One sampled completion. All lists have one entry per generated token."""

    token_ids: list[int]
    logprobs: list[float]  # log p(token) under the sampled distribution (after temperature)
    policy_versions: list[int]  # the engine's policy version when each token was sampled
    finish_reason: FinishReason
    top_logprobs: list[list[tuple[int, float]]] | None = None
    stop_string: str | None = None  # the stop string that ended it, if any


@dataclass
class Partial:
    """A completion still being generated (``Engine.generate_stream``): its first ``length``
    tokens. The lists may be shared with the engine and grow past ``length``; read them up to
    ``length`` only."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None
    length: int


@dataclass
class EngineStats:
    """Point-in-time engine numbers for /metrics and /health."""

    running: int = 0  # requests being decoded
    waiting: int = 0  # requests queued
    extra: dict[str, float] = field(default_factory=dict)


class SamplingEngine(abc.ABC):
    """Samples completions of one model. All methods are called from the server's event
    loop."""

    name: str
    model_path: str
    max_model_len: int
    device: torch.device = torch.device("cpu")  # where the weights live (hf: its device)

    @property
    @abc.abstractmethod
    def policy_version(self) -> int:
        """Version of the weights currently loaded (0 = the weights it started with)."""

    @abc.abstractmethod
    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Completion:
        """Sample one completion. Concurrent calls must be batched together by the engine."""

    async def generate_stream(self, prompt_token_ids: list[int], params: SamplingParams
                              ) -> AsyncGenerator[Partial | Completion, None]:
        """``generate``, reporting progress: a ``Partial`` each time the completion grows, then
        the finished ``Completion`` last. Closing the iterator (or cancelling its consumer)
        aborts the request, as cancelling ``generate`` does. Default: the completion alone
        (an engine that cannot report progress streams nothing before the end)."""
        yield await self.generate(prompt_token_ids, params)

    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """Current load, for metrics."""

    def dead_reason(self) -> str | None:
        """Why this engine can never generate again (its scheduler or worker died), or None
        while it can. Cheap: polled by the server's watchdog (``gspo_rl.server.run``),
        which then reports the server unhealthy and ends the process so that it is restarted."""
        return None


def validate_request(prompt: list[int], p: SamplingParams, vocab_size: int,
                     max_model_len: int) -> None:
    """Every engine's checks of a request, with one set of messages (``RequestRefused``: the
    server answers 400): a non-empty prompt of in-vocabulary ids that leaves room for one new token,
    at least one new token, sampling parameters in range."""
    if not prompt:
        raise RequestRefused("prompt_token_ids must not be empty")
    if any(not 0 <= int(t) < vocab_size for t in prompt):
        raise RequestRefused(f"prompt token ids must lie in [0, {vocab_size})")
    if len(prompt) >= max_model_len:
        raise RequestRefused(f"prompt has {len(prompt)} tokens; max_model_len is "
                         f"{max_model_len} (prompt + at least one new token)")
    if p.max_tokens < 1:
        raise RequestRefused("max_tokens must be >= 1")
    if p.temperature < 0 or not 0 < p.top_p <= 1 or p.top_k < 0 or p.top_logprobs < 0:
        raise RequestRefused("need temperature >= 0, 0 < top_p <= 1, top_k >= 0, "
                         "top_logprobs >= 0")
