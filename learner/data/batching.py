"""Ready groups -> minibatches -> padded microbatches. Pure: numpy and torch on CPU, no I/O.

Notation: ``B`` rows (rollouts) in a microbatch, ``T`` padded token positions, ``L`` one
rollout's length. Every per-token array is aligned with ``token_ids``: entry ``t`` belongs to
token ``t`` (its behavior log-probability scores ``token_ids[t]`` given ``token_ids[:t]``), so
position 0 is never trained.

- A *minibatch* is one optimizer step: the step's rollouts are dealt into ``M`` minibatches of
  roughly equal token counts (longest-processing-time-first), whole groups as the units when
  there are at least ``M`` groups, else single rollouts.
- A *microbatch* is one forward/backward: a minibatch's rollouts sorted longest first and cut
  so that ``rows x longest row <= micro_batch_tokens`` (with ``packed``: the sum of lengths),
  right-padded to their own microbatch's longest row.

Each microbatch's loss is scaled by ``n_valid(micro) / n_valid(minibatch)``
(``MicroBatch.loss_scale``), so the sum over microbatches is the minibatch's loss. Advantages:
one per rollout (``sequence_advantage``), or per token through an ``AdvantageFn``.
Why: docs/design/learner-loop.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from gspo_rl.contract.schema import ReadyGroup, RolloutRecord
from gspo_rl.redisq.ready.reader import Batch

logger = logging.getLogger("gspo_rl.learner.loop")

AdvantageFn = Callable[[ReadyGroup, int], float | np.ndarray]


def sequence_advantage(group: ReadyGroup, i: int) -> float:
    """The group-relative advantage of rollout ``i`` (computed when the group was published)."""
    return float(group.advantages[i])


@dataclass(frozen=True)
class Sample:
    """One rollout, checked and ready to collate."""

    tokens_L: np.ndarray  # int64 token ids
    mask_L: np.ndarray  # float32, 1 on trained tokens
    behavior_L: np.ndarray  # float32 behavior log-probs (0 where mask is 0)
    temperature: float
    advantage: float | np.ndarray  # scalar, or float32 [L] per-token advantages
    rollout_id: str
    group_index: int  # index of the group in the step's list
    top_p: float = 1.0  # the sampler's cut (gspo_rl.contract.sampling_dist): 1 and 0 are "off"
    top_k: int = 0

    @property
    def length(self) -> int:
        return int(self.tokens_L.shape[0])

    @property
    def n_trained(self) -> int:
        return int(self.mask_L.sum())


@dataclass
class MicroBatch:
    """Padded tensors of one forward/backward (CPU; the trainer moves them)."""

    tokens_BT: torch.Tensor  # int64, padding 0
    attention_BT: torch.Tensor  # int64, 1 on real tokens
    mask_BT: torch.Tensor  # float32, 1 on trained tokens (0 on padding, prompts, tool output)
    behavior_BT: torch.Tensor  # float32 behavior log-probs (0 where mask is 0)
    temperature_B: torch.Tensor  # float32
    advantages: torch.Tensor  # float32 [B] or [B, T]
    lengths_B: torch.Tensor  # int64 real lengths
    rollout_ids: list[str]
    loss_scale: float = 1.0  # n_valid(this) / n_valid(minibatch)
    # The sampler's top-p / top-k cut per row (None: no row has one; see policy.Policy).
    top_p_B: torch.Tensor | None = None  # float32
    top_k_B: torch.Tensor | None = None  # int64
    # Filled by the trainer in "recompute" mode: pi_prox and the truncated IS weights.
    old_BT: torch.Tensor | None = None
    is_weights_B: torch.Tensor | None = None

    @property
    def n_valid(self) -> int:
        """Sequences with at least one trained token (those ``policy_loss`` averages over)."""
        return int((self.mask_BT.sum(-1) > 0).sum())

    @property
    def n_trained_tokens(self) -> int:
        return int(self.mask_BT.sum())

    @property
    def n_padded_tokens(self) -> int:
        return int(self.tokens_BT.numel())


@dataclass
class MiniBatch:
    """One optimizer step's microbatches."""

    micro: list[MicroBatch] = field(default_factory=list)

    @property
    def n_valid(self) -> int:
        return sum(m.n_valid for m in self.micro)


@dataclass
class Plan:
    """A step's batch, ready to train."""

    minibatches: list[MiniBatch]
    n_rollouts: int
    n_tokens: int  # real tokens (prompt + completion) that go through the model
    n_trained_tokens: int
    n_padded_tokens: int

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.n_tokens / max(self.n_padded_tokens, 1)


def samples_from_groups(
    groups: Sequence[ReadyGroup], advantage_fn: AdvantageFn = sequence_advantage
) -> list[Sample]:
    """Check every rollout and turn it into a ``Sample``. Raises ``ValueError`` on bad data."""
    out: list[Sample] = []
    for gi, g in enumerate(groups):
        if len(g.advantages) != len(g.rollouts):
            raise ValueError(f"group {g.group_id}: {len(g.rollouts)} rollouts but "
                             f"{len(g.advantages)} advantages")
        for i, r in enumerate(g.rollouts):
            out.append(_sample(r, advantage_fn(g, i), gi))
    return out


def _sample(r: RolloutRecord, adv: float | np.ndarray, group_index: int) -> Sample:
    n = len(r.token_ids)
    if not (len(r.loss_mask) == len(r.logprobs) == n) or n == 0:
        raise ValueError(f"rollout {r.rollout_id}: token_ids, loss_mask and logprobs must have "
                         f"one equal, non-zero length, got {n}, {len(r.loss_mask)}, "
                         f"{len(r.logprobs)}")
    mask = np.asarray(r.loss_mask, dtype=np.float32)
    if mask[0] != 0:
        raise ValueError(f"rollout {r.rollout_id}: loss_mask[0] must be 0 (the first token has "
                         "no log-probability; prompts are at least one token)")
    behavior = np.where(mask > 0, np.asarray(r.logprobs, dtype=np.float32), 0.0)
    if not np.isfinite(behavior).all():
        raise ValueError(f"rollout {r.rollout_id}: non-finite behavior log-prob on a trained "
                         "token")
    if not (r.temperature > 0):
        raise ValueError(f"rollout {r.rollout_id}: temperature must be > 0, got {r.temperature}")
    if isinstance(adv, np.ndarray):
        if adv.shape != (n,):
            raise ValueError(f"rollout {r.rollout_id}: per-token advantages must be [{n}], "
                             f"got {adv.shape}")
        adv = np.where(mask > 0, adv.astype(np.float32), 0.0).astype(np.float32)
    elif not np.isfinite(adv):
        raise ValueError(f"rollout {r.rollout_id}: non-finite advantage {adv}")
    if not 0 < r.top_p <= 1:
        raise ValueError(f"rollout {r.rollout_id}: top_p must be in (0, 1], got {r.top_p}")
    return Sample(tokens_L=np.asarray(r.token_ids, dtype=np.int64), mask_L=mask,
                  behavior_L=behavior.astype(np.float32), temperature=float(r.temperature),
                  advantage=adv, rollout_id=r.rollout_id, group_index=group_index,
                  top_p=float(r.top_p), top_k=max(int(r.top_k), 0))


def collate(samples: Sequence[Sample]) -> MicroBatch:
    """Right-pad ``samples`` to the longest of them."""
    B, T = len(samples), max(s.length for s in samples)
    tokens = np.zeros((B, T), dtype=np.int64)
    attention = np.zeros((B, T), dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.float32)
    behavior = np.zeros((B, T), dtype=np.float32)
    per_token = any(isinstance(s.advantage, np.ndarray) for s in samples)
    adv = np.zeros((B, T) if per_token else (B,), dtype=np.float32)
    for i, s in enumerate(samples):
        n = s.length
        tokens[i, :n], attention[i, :n] = s.tokens_L, 1
        mask[i, :n], behavior[i, :n] = s.mask_L, s.behavior_L
        if per_token:
            adv[i, :n] = s.advantage * s.mask_L if np.isscalar(s.advantage) else s.advantage
        else:
            adv[i] = s.advantage
    cut = any(s.top_p < 1.0 or s.top_k > 0 for s in samples)
    return MicroBatch(
        top_p_B=torch.tensor([s.top_p for s in samples], dtype=torch.float32) if cut else None,
        top_k_B=torch.tensor([s.top_k for s in samples], dtype=torch.int64) if cut else None,
        tokens_BT=torch.from_numpy(tokens), attention_BT=torch.from_numpy(attention),
        mask_BT=torch.from_numpy(mask), behavior_BT=torch.from_numpy(behavior),
        temperature_B=torch.tensor([s.temperature for s in samples], dtype=torch.float32),
        advantages=torch.from_numpy(adv),
        lengths_B=torch.tensor([s.length for s in samples], dtype=torch.int64),
        rollout_ids=[s.rollout_id for s in samples],
    )


def deal_minibatches(samples: Sequence[Sample], n_minibatches: int) -> list[list[Sample]]:
    """Split into at most ``n_minibatches`` non-empty parts of roughly equal token counts.

    Whole groups are dealt when there are at least ``n_minibatches`` of them, single rollouts
    otherwise. Fewer parts come back only when there are fewer rollouts than minibatches.
    """
    if n_minibatches < 1:
        raise ValueError("n_minibatches must be >= 1")
    by_group: dict[int, list[Sample]] = {}
    for s in samples:
        by_group.setdefault(s.group_index, []).append(s)
    units = list(by_group.values()) if len(by_group) >= n_minibatches else [[s] for s in samples]
    m = min(n_minibatches, len(units))
    units.sort(key=lambda u: -sum(s.length for s in u))  # stable: ties keep input order
    parts: list[list[Sample]] = [[] for _ in range(m)]
    tokens = [0] * m
    for u in units:
        j = min(range(m), key=lambda k: (tokens[k], k))
        parts[j].extend(u)
        tokens[j] += sum(s.length for s in u)
    return [p for p in parts if p]


def split_micro(
    samples: Sequence[Sample], micro_batch_tokens: int, min_parts: int = 1,
    packed: bool = False,
) -> list[list[Sample]]:
    """Longest first, cut greedily so that rows x longest row <= ``micro_batch_tokens`` (with
    ``packed``, the policy's packed forward: the sum of the lengths).

    A single rollout longer than the budget gets a microbatch of its own. With ``min_parts``
    (data parallelism: one per rank) the budget shrinks until there are that many parts, or
    one per rollout.
    """
    ordered = sorted(samples, key=lambda s: -s.length)
    budget = micro_batch_tokens

    def cost(part: list[Sample], s: Sample) -> int:
        if packed:
            return sum(x.length for x in part) + s.length
        return (len(part) + 1) * part[0].length

    while True:
        out: list[list[Sample]] = []
        for s in ordered:
            if out and cost(out[-1], s) <= budget:
                out[-1].append(s)
            else:
                out.append([s])
        if len(out) >= min(min_parts, len(ordered)) or budget <= 1:
            return out
        budget = max(1, min(budget, sum(s.length for s in ordered) // min_parts) * 3 // 4)


def plan_step(
    groups: Sequence[ReadyGroup],
    n_minibatches: int,
    micro_batch_tokens: int,
    advantage_fn: AdvantageFn = sequence_advantage,
    min_micro: int = 1,
    packed: bool = False,
) -> Plan:
    """The whole batching pipeline for one training step (``min_micro``: microbatches per
    minibatch wanted at least, one per data-parallel rank; ``packed``: the policy packs each
    microbatch, so its budget counts real tokens and no padding goes through the model)."""
    samples = samples_from_groups(groups, advantage_fn)
    if not samples:
        raise ValueError("no rollouts to train on")
    minibatches: list[MiniBatch] = []
    for part in deal_minibatches(samples, n_minibatches):
        cuts = split_micro(part, micro_batch_tokens, min_micro, packed)
        mb = MiniBatch([collate(c) for c in cuts])
        n_valid = mb.n_valid
        for micro in mb.micro:
            micro.loss_scale = micro.n_valid / n_valid if n_valid else 0.0
        minibatches.append(mb)
    micros = [m for mb in minibatches for m in mb.micro]
    return Plan(
        minibatches=minibatches,
        n_rollouts=len(samples),
        n_tokens=sum(s.length for s in samples),
        n_trained_tokens=sum(s.n_trained for s in samples),
        n_padded_tokens=(sum(s.length for s in samples) if packed
                         else sum(m.n_padded_tokens for m in micros)),
    )


def split_invalid(batch: Batch, advantage_fn: AdvantageFn) -> list[str]:
    """Removes from ``batch`` (in place) the groups that can never be trained, and returns
    their stream ids: a poison group must not crash the learner on every restart."""
    keep, bad = [], []
    for g, eid, st in zip(batch.groups, batch.entry_ids, batch.staleness, strict=True):
        try:
            samples_from_groups([g], advantage_fn)
            keep.append((g, eid, st))
        except ValueError as exc:
            logger.error("dropping invalid group %s (%s): %s", g.group_id, eid, exc)
            bad.append(eid)
    if bad:
        batch.groups = [k[0] for k in keep]
        batch.entry_ids = [k[1] for k in keep]
        batch.staleness = [k[2] for k in keep]
    return bad
