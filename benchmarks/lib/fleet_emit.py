"""The simulated fleet's samples: sequence lengths with a long tail, and rollout records built
as the sampling path builds them (``server/rollouts/sampling.py``: ``rollout_record``), with
random token ids and log-probabilities in place of an engine's.

Contract: ``Shape`` fixes the mean tokens per sample (prompt + completion), the group size,
the prompt length and the tail (completion lengths lognormal around the mean, clipped to the
model's context); ``GroupMaker.lengths`` draws a group's completion lengths from a seeded
generator (the same seed gives the same lengths in every process and mode);
``GroupMaker.records`` builds the group's ``RolloutRecord``s (ids that name their group,
``member_rollout_id``, as the sampling path mints them); ``rewards`` gives a group's rewards
(all equal: the group is dropped for zero variance; else published).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gspo_rl.contract.schema import RolloutRecord, member_rollout_id

VOCAB = 151_936  # Qwen3's vocabulary
BYTES_PER_TOKEN = 13  # int32 token id + uint8 mask + float32 logprob + int32 version


@dataclass(frozen=True)
class Shape:
    """What one sample looks like: ``tokens`` is the mean record length (prompt included)."""

    tokens: int
    group: int
    prompt: int = 256
    sigma: float = 0.5
    max_tokens: int = 40_960  # Qwen3-8B's context (max_position_embeddings)

    @property
    def name(self) -> str:
        t = f"{self.tokens // 1024}k" if self.tokens % 1024 == 0 else str(self.tokens)
        return f"{t} x {self.group}"

    @property
    def max_completion(self) -> int:
        return max(1, self.max_tokens - self.prompt)


def rewards(rng: np.random.Generator, size: int, drop: bool) -> list[float]:
    """A group's rewards: all equal when ``drop`` (the store drops it, zero variance), else
    0/1 with at least one of each (published)."""
    if drop:
        return [float(rng.integers(0, 2))] * size
    r = rng.integers(0, 2, size).astype(float)
    if size > 1:
        r[0], r[1] = 0.0, 1.0
    return [float(x) for x in rng.permutation(r)]


class GroupMaker:
    """Builds one simulated server's groups (one per call); random bytes come from a pool made
    once per process, sliced at random offsets (a sample costs a few copies, not an RNG pass)."""

    def __init__(self, shape: Shape, seed: int, pool: tuple[np.ndarray, np.ndarray]) -> None:
        self.shape = shape
        self.rng = np.random.default_rng(seed)
        self.tokens, self.logprobs = pool
        self.prompt = self.rng.integers(0, VOCAB, shape.prompt).astype(np.int32)
        mean = max(1.0, shape.tokens - shape.prompt)
        self.mu = math.log(mean) - shape.sigma ** 2 / 2  # the lognormal's mean is ``mean``

    def lengths(self) -> np.ndarray:
        """Completion lengths of one group (at least 1, at most the context left)."""
        raw = self.rng.lognormal(self.mu, self.shape.sigma, self.shape.group)
        return np.clip(np.rint(raw), 1, self.shape.max_completion).astype(np.int64)

    def records(self, group_id: str, lengths: np.ndarray,
                meta: dict[str, Any]) -> list[RolloutRecord]:
        return [self._record(group_id, i, int(n), meta) for i, n in enumerate(lengths)]

    def _record(self, group_id: str, index: int, n: int, meta: dict[str, Any]) -> RolloutRecord:
        """``rollout_record``'s layout: prompt (mask 0) then the sampled completion (mask 1)."""
        p = len(self.prompt)
        off = int(self.rng.integers(0, len(self.tokens) - n + 1))
        clipped = n >= self.shape.max_completion
        return RolloutRecord(
            rollout_id=member_rollout_id(group_id, index), group_id=group_id,
            token_ids=np.concatenate([self.prompt, self.tokens[off:off + n]]),
            loss_mask=np.concatenate([np.zeros(p, np.uint8), np.ones(n, np.uint8)]),
            logprobs=np.concatenate([np.zeros(p, np.float32), self.logprobs[off:off + n]]),
            versions=np.concatenate([np.full(p, -1, np.int32), np.zeros(n, np.int32)]),
            prompt_len=p, temperature=1.0, top_p=1.0, top_k=0, turns=[(p, p + n)],
            finish_reason="length" if clipped else "stop", created_at=time.time(),
            metadata=meta)


def random_pool(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and (negative) float32 log-probabilities to slice samples from."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size).astype(np.int32)
    logprobs = (-rng.exponential(1.0, size)).astype(np.float32)
    return tokens, logprobs
