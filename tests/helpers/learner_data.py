"""Test data for the learner: ready groups sampled from a real (tiny) model with plain torch.

Sampling is a full forward per new token (no KV cache, no padding), temperature applied, no
top-p/top-k: the behavior log-probabilities are exactly what a rollout server records.
"""

from __future__ import annotations

import uuid

import numpy as np
import torch

from gspo_rl.contract.schema import ReadyGroup, RolloutRecord
from gspo_rl.learner.algorithm.losses import group_advantages


def low_token_reward(completion: np.ndarray, vocab: int) -> float:
    """A learnable toy reward: the fraction of completion tokens in the lower half of the
    vocabulary."""
    return float((completion < vocab // 2).mean()) if completion.size else 0.0


@torch.no_grad()
def sample_rows(
    model: torch.nn.Module, prompt: list[int], n_rows: int, n_new: int, temperature: float,
    gen: torch.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """``n_rows`` continuations of ``prompt``: token ids ``[R, P + n_new]`` and behavior
    log-probs of the same shape (0 on the prompt). All rows advance together (no padding)."""
    ids = torch.tensor([prompt] * n_rows, dtype=torch.long)
    lps = torch.zeros(n_rows, len(prompt))
    for _ in range(n_new):
        logits = model(input_ids=ids).logits[:, -1].float()
        logp = torch.log_softmax(logits / temperature, dim=-1)
        tok = torch.multinomial(logp.exp(), 1, generator=gen)
        ids = torch.cat([ids, tok], dim=1)
        lps = torch.cat([lps, logp.gather(1, tok)], dim=1)
    return ids.numpy().astype(np.int32), lps.numpy().astype(np.float32)


def sample_group(
    model: torch.nn.Module,
    *,
    group_size: int = 4,
    prompt_len: int = 5,
    new_tokens: tuple[int, int] = (3, 8),
    temperature: float = 1.0,
    version: int = 0,
    seed: int = 0,
    group_id: str | None = None,
) -> ReadyGroup:
    """One group of ``group_size`` rollouts of one random prompt, rewarded by
    ``low_token_reward``, with group-relative advantages."""
    gen = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)
    prompt = torch.randint(10, vocab, (prompt_len,), generator=gen).tolist()
    gid = group_id or f"g-{uuid.uuid4().hex[:8]}"
    lengths = torch.randint(new_tokens[0], new_tokens[1] + 1, (group_size,), generator=gen)
    all_ids, all_lps = sample_rows(model, prompt, group_size, int(lengths.max()), temperature,
                                   gen)
    rollouts: list[RolloutRecord] = []
    rewards: list[float] = []
    for i in range(group_size):
        # A sample cut at a random length is still a sample of its first tokens.
        n = prompt_len + int(lengths[i])
        ids, lps = all_ids[i, :n], all_lps[i, :n]
        mask = np.zeros(len(ids), dtype=np.uint8)
        mask[prompt_len:] = 1
        versions = np.where(mask > 0, version, -1).astype(np.int32)
        rollouts.append(RolloutRecord(
            rollout_id=f"{gid}-r{i}", group_id=gid, token_ids=ids, loss_mask=mask,
            logprobs=lps, versions=versions, prompt_len=prompt_len, temperature=temperature,
            turns=[(prompt_len, len(ids))]))
        rewards.append(low_token_reward(ids[prompt_len:], vocab))
    adv = group_advantages(rewards).tolist()
    return ReadyGroup(group_id=gid, rollouts=rollouts, rewards=rewards, advantages=adv,
                      turn_rewards=[None] * group_size)
