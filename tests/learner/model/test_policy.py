"""gspo_rl.learner.model.policy: the learner's log-probabilities equal the servers' for the same
weights."""

from __future__ import annotations

import asyncio

import pytest
import torch

from gspo_rl.contract.schema import ReadyGroup, RolloutRecord
from gspo_rl.learner.data.batching import collate, samples_from_groups
from gspo_rl.learner.model.policy import Policy, selected_logprobs
from gspo_rl.server.engines.base import SamplingParams
from gspo_rl.server.engines.hf.engine import HFEngine
from tests.helpers.learner_data import sample_group
from tests.helpers.reference_logprobs import sequence_logprobs


def test_selected_logprobs_matches_log_softmax_and_its_gradient(monkeypatch):
    import gspo_rl.learner.model.policy as policy_mod

    monkeypatch.setattr(policy_mod, "_CHUNK_ELEMS", 23)  # several chunks per call
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 11, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (3, 5), generator=g)
    temp = torch.tensor([1.0, 0.7, 1.3])
    w = torch.randn(3, 5, dtype=torch.float64, generator=g)
    got = selected_logprobs(x, targets, temp)
    (got * w).sum().backward()
    grad_got, x.grad = x.grad.clone(), None
    ref = torch.log_softmax(x / temp.double()[:, None, None], -1).gather(
        2, targets[..., None]).squeeze(-1)
    (ref * w).sum().backward()
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_got, x.grad, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: selected_logprobs(t, targets, temp), (x,))


@pytest.mark.parametrize("tied", [True, False])
def test_padded_batch_logprobs_equal_the_reference(tied, tiny_model_dir, tiny_model_untied_dir):
    path = tiny_model_dir if tied else tiny_model_untied_dir
    policy = Policy.load(path, device="cpu")
    groups = [sample_group(policy.model, group_size=3, prompt_len=p, new_tokens=(2, 9),
                           temperature=t, seed=s)
              for p, t, s in ((4, 1.0, 0), (7, 0.6, 1), (2, 1.4, 2))]
    samples = samples_from_groups(groups)
    mb = collate(samples)  # one padded batch, mixed prompt lengths and temperatures
    with torch.no_grad():
        lp = policy.token_logprobs(mb.tokens_BT, mb.attention_BT, mb.temperature_B, mb.mask_BT)
    rollouts = [r for g in groups for r in g.rollouts]
    for i, r in enumerate(rollouts):
        ref = sequence_logprobs(policy.model, r.token_ids.tolist(), r.prompt_len,
                                r.temperature)
        n = len(r.token_ids)
        got = lp[i, r.prompt_len:n]
        torch.testing.assert_close(got, torch.tensor(ref), rtol=0, atol=2e-5)
        # ... and the behavior log-probs recorded by the sampler
        torch.testing.assert_close(got, torch.from_numpy(r.logprobs[r.prompt_len:]),
                                   rtol=0, atol=2e-5)
    assert not lp[:, 0].any()  # nothing scores the first token


def _engine_rollouts(path, n: int, temperature: float) -> list[RolloutRecord]:
    async def run() -> list:
        engine = HFEngine(str(path), max_batch_size=8, device="cpu")
        await engine.start()
        try:
            prompts = [[11, 12, 13, 14], [20, 21], [30, 31, 32, 33, 34, 35]]
            params = [SamplingParams(max_tokens=6 + k, temperature=temperature, seed=k)
                      for k in range(n)]
            outs = await asyncio.gather(*[engine.generate(prompts[k % 3], params[k])
                                          for k in range(n)])
            return [(prompts[k % 3], o) for k, o in enumerate(outs)]
        finally:
            await engine.shutdown()

    import numpy as np

    records = []
    for k, (prompt, c) in enumerate(asyncio.run(run())):
        ids = np.array(prompt + c.token_ids, dtype=np.int32)
        mask = np.r_[np.zeros(len(prompt)), np.ones(len(c.token_ids))].astype(np.uint8)
        lps = np.r_[np.zeros(len(prompt)), c.logprobs].astype(np.float32)
        vers = np.r_[-np.ones(len(prompt)), c.policy_versions].astype(np.int32)
        records.append(RolloutRecord(f"r{k}", "g", ids, mask, lps, vers, len(prompt),
                                     temperature))
    return records


def test_learner_matches_the_hf_engine_behavior_logprobs(tiny_model_dir):
    """Rollouts sampled by the server's transformers engine (continuous batching, KV cache,
    left padding): the learner's padded forward gives the same log-probabilities."""
    rollouts = _engine_rollouts(tiny_model_dir, n=6, temperature=0.8)
    group = ReadyGroup("g", rollouts, [0.0] * 6, [0.0] * 6, [None] * 6)
    mb = collate(samples_from_groups([group]))
    policy = Policy.load(tiny_model_dir, device="cpu")
    with torch.no_grad():
        lp = policy.token_logprobs(mb.tokens_BT, mb.attention_BT, mb.temperature_B, mb.mask_BT)
    diff = ((lp - mb.behavior_BT) * mb.mask_BT).abs().max()
    assert float(diff) < 1e-4


@pytest.mark.gpu
def test_bf16_autocast_on_cuda_stays_close_to_float32(tiny_model_dir):
    groups = [sample_group(Policy.load(tiny_model_dir, device="cpu").model, seed=3)]
    mb = collate(samples_from_groups(groups))
    exact = Policy.load(tiny_model_dir, device="cuda")
    fast = Policy.load(tiny_model_dir, device="cuda", bf16_autocast=True)
    args = (mb.tokens_BT, mb.attention_BT, mb.temperature_B, mb.mask_BT)
    lp32 = exact.token_logprobs(*args)
    lp16 = fast.token_logprobs(*args)
    assert lp16.dtype == torch.float32
    diff = ((lp16 - lp32) * mb.mask_BT.cuda()).abs().max()
    assert float(diff) < 0.1
    (lp16 * mb.mask_BT.cuda()).sum().backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in fast.model.parameters())


def _cudnn_flag_during_forward(policy: Policy, mb) -> list[bool]:
    """``cudnn_sdp_enabled`` as seen inside the model's first attention layer."""
    seen: list[bool] = []
    attn = policy.model.model.layers[0].self_attn
    hook = attn.register_forward_pre_hook(
        lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    try:
        with torch.no_grad():
            policy.token_logprobs(mb.tokens_BT, mb.attention_BT, mb.temperature_B, mb.mask_BT)
    finally:
        hook.remove()
    return seen


def test_padded_forward_leaves_the_sdpa_backends_alone_off_cuda(tiny_model_dir):
    """On the CPU the policy's forward runs with PyTorch's own SDPA choice (the cuDNN
    exclusion is for CUDA: ``Policy._attention``)."""
    policy = Policy.load(tiny_model_dir, device="cpu")
    mb = collate(samples_from_groups([sample_group(policy.model, seed=4)]))
    assert _cudnn_flag_during_forward(policy, mb) == [True]
    assert torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.gpu
def test_padded_forward_on_cuda_runs_without_cudnn_attention(tiny_model_dir):
    """A padded (masked) forward on CUDA excludes cuDNN attention, which builds a graph per
    new shape; the flag is restored after; a packed forward (no mask) is left alone."""
    policy = Policy.load(tiny_model_dir, device="cuda", bf16_autocast=True)
    mb = collate(samples_from_groups([sample_group(
        Policy.load(tiny_model_dir, device="cpu").model, seed=4)]))
    assert _cudnn_flag_during_forward(policy, mb) == [False]
    assert torch.backends.cuda.cudnn_sdp_enabled()
    policy.packing = True
    assert _cudnn_flag_during_forward(policy, mb) == [True]
