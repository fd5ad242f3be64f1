"""The learner-side reference for log-probabilities: one plain forward pass, no padding, no cache.

Engines must report, for every sampled token, exactly what this function computes from the
same weights (within float tolerance); the learner's importance ratios are only right if they
do. Tests of both engines compare against it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def sequence_logprobs(
    model: torch.nn.Module,
    token_ids: Sequence[int],
    prompt_len: int,
    temperature: float = 1.0,
) -> list[float]:
    """Log-probabilities of ``token_ids[prompt_len:]`` given everything before each of them.

    ``log_softmax(logits / temperature)`` at each completion token; temperature 0 (greedy)
    counts as 1, the convention the engines follow for greedy sampling.
    """
    if not 0 < prompt_len < len(token_ids):
        raise ValueError(f"need 0 < prompt_len < len(token_ids), got {prompt_len}")
    temp = temperature if temperature > 0 else 1.0
    device = next(model.parameters()).device
    ids_T = torch.tensor(list(token_ids), dtype=torch.long, device=device)
    with torch.no_grad():
        logits_TV = model(input_ids=ids_T[None]).logits[0].float()
    logp_CV = torch.log_softmax(logits_TV[prompt_len - 1 : -1] / temp, dim=-1)
    return logp_CV.gather(-1, ids_T[prompt_len:, None]).squeeze(-1).tolist()
