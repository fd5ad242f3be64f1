"""A sampler in bfloat16 (vLLM on a GPU) and a learner in float32: what each ``old_logprobs``
mode makes of the numeric gap between them.

GSPO clips the sequence ratio s = exp(mean_t(lp_theta - lp_old)) to [1 - 3e-4, 1 + 4e-4]. The
log-probabilities a bf16 engine reports differ from the float32 learner's by far more than that
on their own, before any update. With ``old_logprobs = "behavior"`` (lp_old = the sampler's),
the first update therefore already sees ratios outside the band: about half the sequences
(those whose gap points the way their advantage pushes) are clipped and give no gradient. With
``"recompute"`` lp_old is the learner's own float32 pass, so the ratio starts at exactly 1,
and the gap goes into the truncated importance weight min(exp(mean_t(lp_prox - lp_beh)), C),
which stays close to 1: every sequence contributes, corrected for the sampler's numerics.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from gspo_rl.learner.algorithm.config import LossConfig
from gspo_rl.learner.algorithm.losses import policy_loss
from gspo_rl.learner.trainer import truncated_is_weights
from tests.helpers.reference_logprobs import sequence_logprobs

B, PROMPT, COMPLETION = 16, 6, 24


def _rows(tiny_model_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float32 learner and bf16 sampler log-probs of the same completions, and the mask."""
    f32 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    bf16 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    g = torch.Generator().manual_seed(0)
    vocab = f32.config.vocab_size
    learner, sampler = [], []
    for _ in range(B):
        ids = torch.randint(0, vocab, (PROMPT + COMPLETION,), generator=g).tolist()
        learner.append(sequence_logprobs(f32, ids, PROMPT, 1.0))
        sampler.append(sequence_logprobs(bf16, ids, PROMPT, 1.0))
    return torch.tensor(learner), torch.tensor(sampler), torch.ones(B, COMPLETION)


def test_bf16_sampler_with_float32_learner(tiny_model_dir: Path) -> None:
    lp_f32, lp_bf16, mask = _rows(tiny_model_dir)
    gap = (lp_f32 - lp_bf16).abs().mean(-1)
    cfg = LossConfig(kind="gspo")
    assert float(gap.median()) > cfg.eps_high  # the numeric gap alone leaves the clip band
    adv = torch.tensor([1.0, -1.0] * (B // 2))

    # behavior: lp_old = the sampler's; the first update already clips
    theta = lp_f32.clone().requires_grad_(True)
    behavior = policy_loss(theta, lp_bf16, adv, mask, cfg)
    behavior.loss.backward()
    assert theta.grad is not None
    clipped_rows = (theta.grad.abs().sum(-1) == 0).float().mean()
    assert behavior.metrics["clip_fraction"] > 0.2 and float(clipped_rows) > 0.2

    # recompute: lp_old = the learner's own pass (ratio exactly 1), gap -> the IS weight
    weights = truncated_is_weights(lp_f32, lp_bf16, mask, cap=2.0)
    theta = lp_f32.clone().requires_grad_(True)
    recompute = policy_loss(theta, lp_f32, adv, mask, cfg, is_weights=weights)
    recompute.loss.backward()
    assert theta.grad is not None
    assert recompute.metrics["clip_fraction"] == 0.0 and recompute.metrics["ratio_mean"] == 1.0
    assert bool((theta.grad.abs().sum(-1) > 0).all())  # every sequence has a gradient
    assert float((weights - 1).abs().max()) < 0.2  # the correction is small and bounded
    # the weight is exactly the sampler -> learner sequence ratio (truncated at C)
    want = torch.exp((lp_f32 - lp_bf16).mean(-1)).clamp(max=2.0)
    torch.testing.assert_close(weights, want)
