"""Top-p / top-k: the behaviour distribution is recorded with every rollout, both engines
record the truncated, renormalised log-probabilities, and the learner recomputes them under
the same cut (``gspo_rl.contract.sampling_dist``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import torch

from gspo_rl.contract.sampling_dist import keep_mask, sampled_logprobs, truncating
from gspo_rl.contract.schema import Keys
from gspo_rl.learner.algorithm.config import LossConfig
from gspo_rl.learner.algorithm.losses import policy_loss
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.data.batching import plan_step
from gspo_rl.learner.model.policy import Policy, cut_logprobs
from gspo_rl.learner.trainer import Trainer
from gspo_rl.server.engines.base import SamplingParams
from gspo_rl.server.engines.hf.engine import HFEngine
from tests.helpers.queue import ready_groups, stored_rollout
from tests.helpers.serving import API_KEY, running_server

KEYS = Keys()
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _logits(n: int = 64, v: int = 50, seed: int = 0, ties: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, v, generator=g) * 3
    if ties:  # exact ties, across the top-k and nucleus boundaries
        x[:8, 10:20] = x[:8, 10:11]
    return x


def _cut_reference(x_NV: torch.Tensor, p: float, k: int) -> torch.Tensor:
    """The kept set by its definition, one row at a time (no sorting tricks)."""
    out = torch.zeros_like(x_NV, dtype=torch.bool)
    for r, row in enumerate(x_NV):
        keep = torch.ones_like(row, dtype=torch.bool)
        if 0 < k < row.numel():
            keep &= row >= torch.topk(row, k).values[-1]
        if p < 1:
            probs = torch.softmax(row.masked_fill(~keep, float("-inf")), -1)
            above = torch.stack([probs[probs > probs[j]].sum() for j in range(row.numel())])
            keep &= (above < p) | (probs == probs.max())  # mass strictly more likely < p
        out[r] = keep
    return out


@pytest.mark.parametrize(("p", "k"), [(0.9, 0), (1.0, 20), (0.9, 20), (0.5, 3), (1.0, 0)])
def test_keep_mask_is_top_k_then_nucleus(p: float, k: int) -> None:
    # Ties with the k-th are all kept; ties at the nucleus boundary are kept in sort order
    # (vLLM's rule: which of them is arbitrary), so the reference sees none there.
    x = _logits(ties=p == 1.0)
    n = x.shape[0]
    got = keep_mask(x, torch.full((n,), p), torch.full((n,), k))
    torch.testing.assert_close(got, _cut_reference(x, p, k))
    assert bool(truncating(torch.tensor([p]), torch.tensor([k]), 50)) == (p < 1 or k > 0)


@pytest.mark.vllm
def test_keep_mask_is_vllms_rule() -> None:
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    x = _logits(seed=1)
    n, v = x.shape
    p = torch.tensor([0.9, 1.0, 0.9, 0.3] * (n // 4))
    k = torch.tensor([0, 20, 20, 5] * (n // 4))
    theirs = ops.apply_top_k_top_p_pytorch(x.clone(), torch.where(k > 0, k, v), p)
    torch.testing.assert_close(keep_mask(x, p, k), theirs > float("-inf"))


def test_sampled_logprobs_value_gradient_and_untruncated_rows() -> None:
    x = _logits(n=12, v=30, seed=2, ties=False).double().requires_grad_(True)
    g = torch.Generator().manual_seed(3)
    tgt = torch.randint(0, 30, (12,), generator=g)
    temp = torch.full((12,), 0.8, dtype=torch.float64)
    p = torch.tensor([0.9] * 6 + [1.0] * 6)
    k = torch.tensor([20] * 4 + [0] * 8)
    scaled = x.detach() / 0.8
    keep = keep_mask(scaled, p, k)
    keep[torch.arange(12), tgt] = True  # the drawn token always counts (module docstring)
    want = torch.log_softmax(scaled.masked_fill(~keep, float("-inf")), -1)[torch.arange(12), tgt]
    got = sampled_logprobs(x, tgt, temp, p, k)
    torch.testing.assert_close(got.detach(), want)
    plain = torch.log_softmax(scaled, -1)[torch.arange(12), tgt]
    torch.testing.assert_close(got[8:].detach(), plain[8:])  # no cut: log_softmax(z / T)
    assert torch.isfinite(got).all()
    assert torch.autograd.gradcheck(lambda t: sampled_logprobs(t, tgt, temp, p, k), (x,))


@pytest.mark.gpu
def test_cut_logprobs_on_cuda_equal_cpu_with_parameters_on_the_cpu() -> None:
    x = _logits(n=16, v=40, seed=4, ties=False).view(2, 8, 40)
    tgt = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(5))
    temp, p, k = torch.tensor([0.8, 1.2]), torch.tensor([0.9, 1.0]), torch.tensor([20, 0])
    want = cut_logprobs(x, tgt, temp, p, k)
    got = cut_logprobs(x.cuda(), tgt.cuda(), temp.cuda(), p, k)  # the batch's, on the CPU
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=1e-5)


def _hf_rollouts(path: Path, params: list[SamplingParams]) -> list[tuple[list[int], object]]:
    async def run() -> list:
        engine = HFEngine(str(path), max_batch_size=8, device="cpu")
        await engine.start()
        try:
            prompts = [[11, 12, 13, 14], [20, 21], [30, 31, 32, 33, 34, 35]]
            outs = await asyncio.gather(*[engine.generate(prompts[i % 3], p)
                                          for i, p in enumerate(params)])
            return [(prompts[i % 3], o) for i, o in enumerate(outs)]
        finally:
            await engine.shutdown()

    return asyncio.run(run())


def test_hf_engine_records_the_cut_distribution_the_learner_recomputes(
        tiny_model_dir: Path) -> None:
    cuts = [(0.9, 0), (1.0, 20), (0.9, 20), (1.0, 0)]
    params = [SamplingParams(max_tokens=12, temperature=0.8, top_p=p, top_k=k, seed=i)
              for i, (p, k) in enumerate(cuts * 2)]
    model = Policy.load(tiny_model_dir, device="cpu").model
    for (prompt, out), sp in zip(_hf_rollouts(tiny_model_dir, params), params, strict=True):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
        n = len(out.token_ids)
        ours = sampled_logprobs(logits, torch.tensor(out.token_ids), torch.full((n,), 0.8),
                                torch.full((n,), sp.top_p), torch.full((n,), sp.top_k))
        torch.testing.assert_close(torch.tensor(out.logprobs), ours, rtol=0, atol=1e-4)


def test_cut_rollouts_through_server_redis_and_learner(tiny_model_dir: Path,
                                                       redis_url: str) -> None:
    """top_p = 0.9, top_k = 20 on the native route: recorded with the rollouts, and the
    learner's log-probs at theta = theta_old equal the recorded ones (ratio 1, nothing
    clipped); without the cut they would not (the issue: ratio_mean 0.90, half clipped)."""
    with running_server(tiny_model_dir, redis_url) as served:
        groups = []
        for cut in ({"top_p": 0.9, "top_k": 20}, {"top_p": 0.9}, {"top_k": 20}):
            r = httpx.post(f"{served.url}/v1/rollouts", headers=AUTH, timeout=60, json={
                "prompt_token_ids": [5, 17, 42, 99], "n": 4, "max_tokens": 16,
                "temperature": 0.8, "seed": 1, **cut})
            assert r.status_code == 200, r.text
            body = r.json()
            rids = [x["rollout_id"] for x in body["rollouts"]]
            rewards = [{"rollout_id": rid, "reward": float(i % 2)} for i, rid in enumerate(rids)]
            assert httpx.post(f"{served.url}/v1/rewards", headers=AUTH, json=rewards,
                              timeout=30).status_code == 200
            groups.append((body["group_id"], cut, rids))
        client = redis.Redis.from_url(redis_url)
        try:
            for _, cut, rids in groups:
                rec = stored_rollout(client, rids[0], KEYS)
                assert rec is not None
                assert (rec.temperature, rec.top_p, rec.top_k) == (
                    0.8, cut.get("top_p", 1.0), cut.get("top_k", 0))
            ready = ready_groups(client, KEYS)
        finally:
            client.close()
    assert len(ready) == 3
    (micro,) = plan_step(ready, 1, 10**9).minibatches[0].micro
    assert micro.top_p_B is not None and micro.top_k_B is not None
    policy = Policy.load(tiny_model_dir, device="cpu")
    with torch.no_grad():
        lp = policy.token_logprobs(micro.tokens_BT, micro.attention_BT, micro.temperature_B,
                                   micro.mask_BT, micro.top_p_B, micro.top_k_B)
        plain = policy.token_logprobs(micro.tokens_BT, micro.attention_BT,
                                      micro.temperature_B, micro.mask_BT)
    mask = micro.mask_BT
    assert float(((lp - micro.behavior_BT) * mask).abs().max()) < 1e-4
    assert float(((plain - micro.behavior_BT) * mask).abs().max()) > 1e-2
    out = policy_loss(lp, micro.behavior_BT, micro.advantages, mask, LossConfig(kind="gspo"))
    assert out.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert out.metrics["clip_fraction"] == 0.0
    assert np.isfinite(out.metrics["loss"])
    # The trainer's step computes the same: nothing clipped in its one (on-policy) minibatch,
    # clipping around the sampler's log-probabilities (not a recomputed pi_prox).
    cfg = LearnerConfig(model=str(tiny_model_dir), loss=LossConfig(kind="gspo"),
                        minibatches=1, old_logprobs="behavior")
    metrics = Trainer(policy, cfg).step(ready)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["clip_fraction"] == 0.0 and metrics["optimizer_steps"] == 1
