"""An engine that samples nothing: every request ends after a random delay with ``max_tokens``
tokens, so a benchmark measures the serving process's own work per request (HTTP, FastAPI,
validation, recording in Redis, the response) without an engine's CPU beside it.

Benchmarks only (``bench_server_cpu``): it never ships as an engine of ``gspo serve``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable

import torch

from gspo_rl.server.engines.base import Completion, Engine, EngineStats, SamplingParams


class InstantEngine(Engine):
    """Ends each request after ``delay_s`` x uniform(0.5, 1.5) on the event loop (a timer, no
    thread): requests end one by one, as the mixed lengths of RL rollouts make them end."""

    name = "instant"

    def __init__(self, model_path: str, delay_s: float, max_model_len: int = 4096,
                 seed: int = 0) -> None:
        self.model_path = model_path
        self.max_model_len = max_model_len
        self.delay_s = delay_s
        self._rng = random.Random(seed)
        self._running = 0

    @property
    def policy_version(self) -> int:
        return 0

    async def start(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Completion:
        n = params.max_tokens
        self._running += 1
        try:
            await asyncio.sleep(self.delay_s * self._rng.uniform(0.5, 1.5))
        finally:
            self._running -= 1
        ids = [(t * 7 + 3) % 500 + 10 for t in range(n)]  # ordinary ids of a tiny vocabulary
        return Completion(token_ids=ids, logprobs=[-0.5] * n, policy_versions=[0] * n,
                          finish_reason="length")

    async def pause(self) -> None:
        return None

    async def resume(self) -> None:
        return None

    async def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                           version: int) -> None:
        raise NotImplementedError("the instant engine has no weights")

    def stats(self) -> EngineStats:
        return EngineStats(running=self._running)
