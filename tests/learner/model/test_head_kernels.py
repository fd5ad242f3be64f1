"""gspo_rl.learner.model.head_kernels: the Triton softmax passes of the fused head equal PyTorch's.

The kernels run on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``, read when the
module is imported: a subprocess), and natively on CUDA (``gpu``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed")

def check_kernels(device: str, sizes: tuple[tuple[int, int], ...]) -> None:
    """Both kernels against PyTorch on random logits of each ``(rows, vocabulary)`` size."""
    from gspo_rl.learner.model import head_kernels as hk

    g = torch.Generator(device=device).manual_seed(0)
    for dt in (torch.bfloat16, torch.float16):
        for c, v in sizes:
            x = (torch.randn(c, v, device=device, generator=g) * 3).to(dt)
            t = torch.randint(0, v, (c,), device=device, generator=g)
            gr = torch.randn(c, device=device, generator=g)
            assert hk.available(x)
            lp, lse = hk.lse_pick(x, t)
            ref = torch.log_softmax(x, -1, dtype=torch.float32)
            torch.testing.assert_close(lse, torch.logsumexp(x.float(), -1), rtol=1e-6,
                                       atol=1e-4)
            torch.testing.assert_close(lp, ref.gather(1, t[:, None])[:, 0], rtol=1e-6,
                                       atol=1e-4)
            p = torch.softmax(x, -1, dtype=torch.float32)
            p.mul_(-gr[:, None]).scatter_add_(1, t[:, None], gr[:, None])
            y = x.clone()
            out = hk.grad_into(y, t, lse, gr)
            assert out.data_ptr() == y.data_ptr()  # in place over the logits
            tol = float(p.abs().max()) * 2 ** -7  # one bf16 rounding
            torch.testing.assert_close(out.float(), p.to(dt).float(), rtol=0, atol=tol)


_CHECKS = '''
import torch
from gspo_rl.learner.model.head_kernels import BLOCK
from gspo_rl.learner.model.logprob_head import fused_logprobs
from tests.learner.model.test_head_kernels import check_kernels

check_kernels("cpu", ((5, 37), (3, 5000), (4, 2 * BLOCK + 3)))

# The whole head through the kernels (several chunks) against plain autograd in float32.
torch.manual_seed(0)
n, d, v = 40, 16, 300
h = torch.randn(n, d).bfloat16().requires_grad_(True)
w = (torch.randn(v, d) * 0.3).bfloat16().requires_grad_(True)
y = torch.randint(0, v, (n,))
temp = torch.rand(n) + 0.5
wt = torch.randn(n)
got = fused_logprobs(h, w, y, temperature_N=temp, chunk_elems=7 * v)
gh, gw = torch.autograd.grad((got * wt).sum(), (h, w))
hf, wf = h.detach().float().requires_grad_(True), w.detach().float().requires_grad_(True)
logits = (hf / temp[:, None]).bfloat16().float() @ wf.T
ref = torch.log_softmax(logits, -1).gather(1, y[:, None])[:, 0]
rh, rw = torch.autograd.grad((ref * wt).sum(), (hf, wf))
assert got.dtype == torch.float32
assert float((got - ref).abs().max()) < 0.05, float((got - ref).abs().max())
for a, b in ((gh, rh), (gw, rw)):
    assert a.dtype == torch.bfloat16
    err = float((a.float() - b).norm() / b.norm())
    assert err < 2e-2, err
print("kernels ok")
'''


@needs_triton
def test_kernels_equal_pytorch_under_the_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", _CHECKS], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "kernels ok" in out.stdout


def test_kernels_are_not_used_for_float32_or_cpu_tensors():
    from gspo_rl.learner.model import head_kernels

    assert not head_kernels.available(torch.zeros(2, 3))
    if os.environ.get("TRITON_INTERPRET") != "1":
        assert not head_kernels.available(torch.zeros(2, 3, dtype=torch.bfloat16))


@pytest.mark.gpu
@needs_triton
def test_cuda_kernels_equal_pytorch():
    check_kernels("cuda", ((64, 151936), (64, 1000)))
