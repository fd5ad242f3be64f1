"""gspo_rl.learner.model.logprob_head: the fused, chunked head equals the plain one (values and
gradients)."""

from __future__ import annotations

import torch

from gspo_rl.learner.model.logprob_head import LogSoftmaxPick, fused_logprobs


def _inputs(n: int = 13, d: int = 6, v: int = 17, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, dtype=dtype, generator=g, requires_grad=True)
    w = torch.randn(v, d, dtype=dtype, generator=g, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)
    temp = torch.rand(n, generator=g, dtype=torch.float32) + 0.5
    weights = torch.randn(n, dtype=dtype, generator=g)
    return h, w, targets, temp, weights


def _plain(h, w, targets, temp):
    logits = h @ w.T
    return torch.log_softmax(logits / temp.to(logits.dtype)[:, None], -1).gather(
        1, targets[:, None]).squeeze(1)


def _grads(lp, weights, *xs):
    return torch.autograd.grad((lp * weights).sum(), xs)


def test_fused_head_equals_the_plain_head_values_and_gradients():
    h, w, targets, temp, weights = _inputs()
    got = fused_logprobs(h, w, targets, temperature_N=temp.double(), chunk_elems=3 * 17)
    ref = _plain(h, w, targets, temp)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    for a, b in zip(_grads(got, weights, h, w), _grads(ref, weights, h, w), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda hh, ww: fused_logprobs(hh, ww, targets, temperature_N=temp.double(),
                                      chunk_elems=40), (h, w))


def test_float32_head_matches_and_returns_float32():
    h, w, targets, temp, weights = _inputs(dtype=torch.float32)
    got = fused_logprobs(h, w, targets, temperature_N=temp, chunk_elems=50)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, _plain(h, w, targets, temp), rtol=0, atol=1e-5)


def test_logits_exist_one_chunk_at_a_time():
    """Forward and backward see logits of at most ``chunk_elems // V`` rows."""
    h, w, targets, temp, weights = _inputs(n=50, v=10)
    rows_seen: list[int] = []
    inner = LogSoftmaxPick()

    def spy(logits_CV, targets_C, rows):
        rows_seen.append(logits_CV.shape[0])
        return inner(logits_CV, targets_C, rows)

    lp = fused_logprobs(h, w, targets, spy, temp.double(), chunk_elems=70)
    lp.sum().backward()
    assert max(rows_seen) == 7 and sum(rows_seen) == 2 * 50  # forward + recompute


def test_a_plugged_chunk_transform_gets_its_own_exact_gradient():
    """A per-chunk transform (here: keep each row's 4 largest logits, as top-k sampling does)
    is applied per chunk, with per-row parameters indexed by ``rows``."""
    h, w, targets, temp, weights = _inputs(n=11, v=9)
    targets = (h.detach() @ w.detach().T).argmax(-1)  # inside the top-k set

    def top4(logits_CV, targets_C, rows):
        x = logits_CV / temp[rows, None].double()
        kth = x.topk(4, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
        return torch.log_softmax(x, -1).gather(1, targets_C[:, None]).squeeze(1)

    got = fused_logprobs(h, w, targets, top4, chunk_elems=27)
    ref = top4(h @ w.T, targets, slice(0, 11))
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    for a, b in zip(_grads(got, weights, h, w), _grads(ref, weights, h, w), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_no_rows_gives_an_empty_result_that_backpropagates():
    h, w, _, _, _ = _inputs()
    out = fused_logprobs(h[:0], w, torch.zeros(0, dtype=torch.long),
                         temperature_N=torch.ones(0))
    assert out.shape == (0,)
    out.sum().backward()
    assert h.grad is not None and not h.grad.any()


def test_frozen_weight_gets_no_gradient():
    h, w, targets, temp, weights = _inputs()
    w = w.detach()
    fused_logprobs(h, w, targets, temperature_N=temp.double(), chunk_elems=40).sum().backward()
    assert w.grad is None and h.grad is not None
