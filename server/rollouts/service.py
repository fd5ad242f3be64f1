"""The sampling service: what the chat, completions and rollouts routes share.

Each of those routes runs the same pipeline: check the model name, turn the request into
prompt token ids (the one step that differs per route), plan the generation, sample ``n``
completions and record them as a group. The service holds the six objects that pipeline
needs (the engine's sampling half, store, tokenizer, token texts, settings, metrics); it is
built once in the app's lifespan (``app.state.sampling``) and shared by the three sampling
routes' serving objects (``gspo_rl.server.rollouts.serving``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gspo_rl.contract.chat.messages import end_token_ids
from gspo_rl.redisq.groups.store import RolloutStore
from gspo_rl.server.config import ServerSettings
from gspo_rl.server.engines.sampler import Completion, SamplingEngine
from gspo_rl.server.metrics import ServerMetrics
from gspo_rl.server.rollouts.chat.render import (
    TokenTexts,
    completion_text,
    sequence_decoder,
)
from gspo_rl.server.rollouts.episodes import PlannedTurn, commit_turn, episode_turn, plan_turn
from gspo_rl.server.rollouts.protocol.base import SamplingFields
from gspo_rl.server.rollouts.protocol.chat import ChatCompletionRequest
from gspo_rl.server.rollouts.sampling import (
    GenerationPlan,
    GroupResult,
    check_model,
    first_version,
    plan_generation,
    sample_group,
)


@dataclass(frozen=True)
class SamplingService:
    """One per app; every method is safe to call from concurrent requests."""

    engine: SamplingEngine
    store: RolloutStore
    tokenizer: Any
    texts: TokenTexts
    settings: ServerSettings
    metrics: ServerMetrics
    # Computed once: the tokenizer's added vocabulary (behind the end ids) is rebuilt as a
    # dict on every call, and the model name parses a path (~0.1 ms a request together).
    _stop_ids: tuple[int, ...] = field(init=False, repr=False)
    _decode: Callable[[list[int]], str] = field(init=False, repr=False)
    model_name: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_stop_ids", end_token_ids(self.tokenizer))
        object.__setattr__(self, "_decode", sequence_decoder(self.tokenizer))
        object.__setattr__(self, "model_name", self.settings.model_name)

    def check_model(self, requested: str | None) -> None:
        """404 for a model this server does not serve."""
        check_model(requested, self.settings, self.model_name)

    def stop_token_ids(self) -> tuple[int, ...]:
        """EOS and end-of-turn ids (``gspo_rl.contract.chat.messages.end_token_ids``)."""
        return self._stop_ids

    def plan(self, body: SamplingFields, prompt_ids: list[int], *, max_tokens: int | None,
             top_logprobs: int, route: str) -> GenerationPlan:
        """Checks ``body``'s limits and plans its generation over ``prompt_ids``."""
        return plan_generation(
            body, prompt_token_ids=prompt_ids, max_tokens=max_tokens,
            top_logprobs=top_logprobs, stop_token_ids=self.stop_token_ids(),
            engine=self.engine, settings=self.settings, route=route)

    async def sample(self, body: SamplingFields, prompt_ids: list[int], *,
                     max_tokens: int | None, top_logprobs: int, route: str) -> GroupResult:
        """Plans ``body``'s generation over ``prompt_ids``, samples it, records the group."""
        plan = self.plan(body, prompt_ids, max_tokens=max_tokens, top_logprobs=top_logprobs,
                         route=route)
        return await sample_group(self.engine, self.store, plan, self.metrics,
                                  self.settings.server_id)

    async def episode_turn(self, body: ChatCompletionRequest, *, top_logprobs: int,
                           with_tools: bool) -> GroupResult:
        """One more turn of the multi-turn episode ``body.rollout_id``
        (``gspo_rl.server.rollouts.episodes``)."""
        return await episode_turn(body, store=self.store, engine=self.engine,
                                  tokenizer=self.tokenizer, settings=self.settings,
                                  metrics=self.metrics, top_logprobs=top_logprobs,
                                  with_tools=with_tools)

    async def plan_turn(self, body: ChatCompletionRequest, *,
                        top_logprobs: int) -> PlannedTurn:
        """A checked episode turn, ready to sample (streamed turns: ``ChatServing.plan_turn``)."""
        return await plan_turn(body, store=self.store, engine=self.engine,
                               tokenizer=self.tokenizer, settings=self.settings,
                               top_logprobs=top_logprobs)

    async def commit_turn(self, turn: PlannedTurn, completion: Completion,
                          body: ChatCompletionRequest, *, with_tools: bool,
                          started: float) -> GroupResult:
        """Appends a sampled (streamed) turn to its episode, as ``episode_turn`` does."""
        return await commit_turn(turn, completion, body, store=self.store,
                                 tokenizer=self.tokenizer, settings=self.settings,
                                 metrics=self.metrics, with_tools=with_tools, started=started)

    def text(self, completion: Completion, stop_ids: tuple[int, ...]) -> str:
        """The completion's text as the client sees it (end tokens dropped)."""
        return completion_text(self.tokenizer, completion, stop_ids, self._decode)

    def first_version(self, completion: Completion) -> int:
        """The policy version that sampled the completion's first token."""
        return first_version(completion, self.engine)
