"""gspo_rl.learner.data.packing and the policy's packed forward: the same log-probs and gradients as
the padded forward, and as the logits path it replaces (float32 on the CPU)."""

from __future__ import annotations

import pytest
import torch

import gspo_rl.learner.model.policy as policy_mod
from gspo_rl.learner.data.batching import collate, samples_from_groups
from gspo_rl.learner.data.packing import pack_inputs, scatter_rows, target_positions
from gspo_rl.learner.model.policy import Policy
from tests.helpers.learner_data import sample_group


def test_pack_inputs_lays_real_tokens_end_to_end_with_restarting_positions():
    tokens = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0], [0, 11, 12, 13]])
    attention = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 1, 1]])
    p = pack_inputs(tokens, attention)
    # each row's tokens but its last; padding (right or left) is dropped
    assert p.input_ids_1N.tolist() == [[5, 6, 7, 9, 11, 12]]
    assert p.position_ids_1N.tolist() == [[0, 1, 2, 0, 0, 1]]
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 0, 0], [0, 0, 0, 1]], dtype=torch.float32)
    sel = target_positions(attention, mask)
    assert sel.tolist() == [[False, True, True], [True, False, False],
                            [False, False, True]]
    out = scatter_rows(torch.tensor([1.0, 2.0, 3.0, 4.0]), sel)
    assert out.tolist() == [[0, 0, 1, 2], [0, 3, 0, 0], [0, 0, 0, 4]]


def _batch(policy: Policy):
    groups = [sample_group(policy.model, group_size=3, prompt_len=p, new_tokens=(2, 9),
                           temperature=t, seed=s)
              for p, t, s in ((4, 1.0, 0), (7, 0.6, 1), (2, 1.4, 2))]
    return collate(samples_from_groups(groups))


def _lp_and_grads(policy: Policy, mb, weights_BT: torch.Tensor):
    policy.model.zero_grad(set_to_none=True)
    lp = policy.token_logprobs(mb.tokens_BT, mb.attention_BT, mb.temperature_B, mb.mask_BT)
    (lp * weights_BT * mb.mask_BT).sum().backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters()}
    return lp.detach(), grads


@pytest.mark.parametrize("tied", [True, False])
def test_packed_equals_padded_equals_logits_path(tied, tiny_model_dir, tiny_model_untied_dir,
                                                 monkeypatch):
    policy = Policy.load(tiny_model_dir if tied else tiny_model_untied_dir, device="cpu")
    mb = _batch(policy)
    w = torch.randn(mb.tokens_BT.shape, generator=torch.Generator().manual_seed(1))
    policy.packing = True
    packed, g_packed = _lp_and_grads(policy, mb, w)
    policy.packing = False
    padded, g_padded = _lp_and_grads(policy, mb, w)
    with monkeypatch.context() as m:  # the previous implementation: the model's logits
        m.setattr(policy_mod, "fused_head_weight", lambda model: None)
        logits_path, g_logits = _lp_and_grads(policy, mb, w)
    trained = mb.mask_BT > 0
    assert trained.sum() > 20
    for other in (padded, logits_path):
        torch.testing.assert_close(packed[trained], other[trained], rtol=2e-6, atol=2e-6)
    assert not packed[~trained].any()
    for name in g_packed:
        for other in (g_padded, g_logits):
            # float32 rounding only: within 1e-5 of the gradient's largest entry
            scale = float(other[name].abs().max())
            assert float((g_packed[name] - other[name]).abs().max()) <= 1e-5 * scale, name


def test_packed_forward_sees_one_row_without_padding(tiny_model_dir):
    policy = Policy.load(tiny_model_dir, device="cpu")
    policy.packing = True
    mb = _batch(policy)
    shapes: list[tuple[int, ...]] = []
    base = policy.model.model
    handle = base.register_forward_pre_hook(
        lambda mod, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True)
    try:
        with torch.no_grad():
            policy.token_logprobs(mb.tokens_BT, mb.attention_BT, mb.temperature_B, mb.mask_BT)
    finally:
        handle.remove()
    n_inputs = int((mb.lengths_B - 1).sum())
    assert shapes == [(1, n_inputs)]
    assert n_inputs < mb.tokens_BT[:, :-1].numel()  # there was padding to drop


@pytest.mark.parametrize("tied", [True, False])
def test_varlen_attention_packed_equals_padded(tied, tiny_model_dir, tiny_model_untied_dir):
    """``gspo_rl.learner.model.varlen`` (the CUDA default without flash-attn) takes the sequence
    offsets through the model's forward; on the CPU it attends one sequence at a time, exactly: its
    packed log-probs and gradients equal the padded sdpa ones."""
    from gspo_rl.learner.model import varlen

    policy = Policy.load(tiny_model_dir if tied else tiny_model_untied_dir, device="cpu")
    mb = _batch(policy)
    w = torch.randn(mb.tokens_BT.shape, generator=torch.Generator().manual_seed(3))
    padded, g_padded = _lp_and_grads(policy, mb, w)
    policy.model.set_attn_implementation(varlen.register())
    policy.packing = True
    calls: list[int] = []
    real = varlen.reference_varlen
    try:
        varlen.reference_varlen = lambda *a: calls.append(len(a[3]) - 1) or real(*a)
        packed, g_packed = _lp_and_grads(policy, mb, w)
    finally:
        varlen.reference_varlen = real
    assert calls and set(calls) == {mb.tokens_BT.shape[0]}  # every layer saw every sequence
    trained = mb.mask_BT > 0
    torch.testing.assert_close(packed[trained], padded[trained], rtol=2e-6, atol=2e-6)
    for name, g in g_packed.items():
        scale = float(g_padded[name].abs().max())
        assert float((g - g_padded[name]).abs().max()) <= 1e-5 * scale, name


def test_varlen_attention_serves_padded_batches_as_sdpa(tiny_model_dir):
    """Without sequence offsets (packing off, the logits path) the attention is sdpa's, with
    its padding mask: the same log-probs as the model on sdpa."""
    from gspo_rl.learner.model import varlen

    policy = Policy.load(tiny_model_dir, device="cpu")
    mb = _batch(policy)
    args = (mb.tokens_BT, mb.attention_BT, mb.temperature_B, mb.mask_BT)
    with torch.no_grad():
        sdpa = policy.token_logprobs(*args)
        policy.model.set_attn_implementation(varlen.register())
        ours = policy.token_logprobs(*args)
    assert (mb.attention_BT == 0).any()  # the batch has padding
    torch.testing.assert_close(ours, sdpa, rtol=0, atol=0)
    with pytest.raises(ValueError, match="one packed row"):
        varlen.attention(policy.model, *(torch.zeros(2, 2, 3, 8) for _ in range(3)), None,
                         cu_seq_lens_q=torch.tensor([0, 3]), max_length_q=3)


def test_pack_inputs_sequence_offsets_skip_empty_rows():
    tokens = torch.tensor([[5, 6, 7, 8], [9, 0, 0, 0], [0, 11, 12, 13]])
    attention = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 1, 1, 1]])
    p = pack_inputs(tokens, attention)
    assert p.cu_seqlens_S1.tolist() == [0, 3, 5] and p.max_len == 3
    assert p.cu_seqlens_S1.dtype == torch.int32
    assert p.attention_kwargs()["max_length_q"] == 3


def test_top_p_top_k_rows_through_the_fused_head_equal_the_logits_path(tiny_model_dir,
                                                                       monkeypatch):
    """Rows sampled with a top-p / top-k cut (``gspo_rl.contract.sampling_dist``) plug into the
    fused head as its per-chunk function: packed and padded equal the logits path, values and
    gradients; rows without a cut in the same batch stay plain."""
    policy = Policy.load(tiny_model_dir, device="cpu")
    mb = _batch(policy)
    n = mb.tokens_BT.shape[0]
    top_p = torch.tensor([0.9, 1.0, 0.7] * (n // 3) + [1.0] * (n % 3))
    top_k = torch.tensor([0, 20, 5] * (n // 3) + [0] * (n % 3))
    w = torch.randn(mb.tokens_BT.shape, generator=torch.Generator().manual_seed(2))

    def run():
        policy.model.zero_grad(set_to_none=True)
        lp = policy.token_logprobs(mb.tokens_BT, mb.attention_BT, mb.temperature_B, mb.mask_BT,
                                   top_p, top_k)
        (lp * w * mb.mask_BT).sum().backward()
        return lp.detach(), {k: p.grad.clone() for k, p in policy.model.named_parameters()}

    policy.packing = True
    packed, g_packed = run()
    policy.packing = False
    padded, g_padded = run()
    with monkeypatch.context() as m:
        m.setattr(policy_mod, "fused_head_weight", lambda model: None)
        ref, g_ref = run()
    trained = mb.mask_BT > 0
    for got, grads in ((packed, g_packed), (padded, g_padded)):
        torch.testing.assert_close(got[trained], ref[trained], rtol=2e-6, atol=1e-5)
        for name, g in g_ref.items():
            assert float((grads[name] - g).abs().max()) <= 1e-5 * float(g.abs().max()), name


@pytest.mark.gpu
@pytest.mark.parametrize("heads,kv_heads", [(14, 2), (4, 4)])
def test_cuda_flash_varlen_equals_attention_per_sequence(heads, kv_heads):
    """PyTorch's FlashAttention-2 varlen kernels (bf16) against one float32 SDPA per sequence:
    outputs and the gradients of q, k and v (grouped KV heads as they are)."""
    from gspo_rl.learner.model import varlen

    g = torch.Generator(device="cuda").manual_seed(0)
    lengths = [1, 37, 300, 128, 5]
    n, d = sum(lengths), 64
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda",
                      dtype=torch.int32)
    q, k, v = (torch.randn(n, h, d, device="cuda", generator=g).bfloat16().requires_grad_(True)
               for h in (heads, kv_heads, kv_heads))
    w = torch.randn(n, heads, d, device="cuda", generator=g)
    out = varlen.varlen_causal(q, k, v, cu, max(lengths), 0.125)
    grads = torch.autograd.grad((out.float() * w).sum(), (q, k, v))
    qf, kf, vf = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    ref = varlen.reference_varlen(qf, kf, vf, cu, 0.125)
    ref_grads = torch.autograd.grad((ref * w).sum(), (qf, kf, vf))
    assert out.shape == (n, heads, d) and out.dtype == torch.bfloat16
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
    for a, b in zip(grads, ref_grads, strict=True):
        assert a.shape == b.shape
        assert float((a.float() - b).norm() / b.norm()) < 2e-2
