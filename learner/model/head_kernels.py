"""Triton kernels for the fused log-prob head's softmax passes (CUDA, bf16/fp16 logits).

The head (``gspo_rl.learner.model.logprob_head``) projects a chunk of hidden states onto the
vocabulary, ``logits_CV`` in the weights' dtype. In plain PyTorch its log-softmax costs several
passes over ``[C, V]`` in float32 (a float32 log-softmax written out, then in backward a float32
softmax, a multiply, a cast back). These two kernels read the bf16 logits once per direction:

- ``lse_pick``: per row, the log-sum-exp (online, float32) and ``logits[target] - lse``;
- ``grad_into``: per row, ``g * (onehot(target) - exp(logits - lse))`` written over the
  logits in place (the recomputed logits are dead after this), in their dtype.

Each program handles one row and walks its vocabulary in ``BLOCK`` columns. Numerics: the
same float32 arithmetic as ``torch.log_softmax(x, dtype=float32)`` up to summation order.

``available(x)`` says whether a tensor can take this path (CUDA, bf16/fp16, Triton
importable); the head falls back to PyTorch otherwise. ``TRITON_INTERPRET=1`` runs the
kernels on the CPU (the tests do, in a subprocess).
"""

from __future__ import annotations

import importlib.util
import os

import torch

_HAVE_TRITON = importlib.util.find_spec("triton") is not None
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 4096

if _HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _lse_pick_kernel(x_ptr, t_ptr, lse_ptr, out_ptr, stride, V, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = x_ptr + row * stride
        cols = tl.arange(0, BLOCK)
        m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
        s_vec = tl.zeros([BLOCK], tl.float32)
        for off in range(0, V, BLOCK):
            x = tl.load(base + off + cols, mask=off + cols < V, other=float("-inf"))
            x = x.to(tl.float32)
            m_new = tl.maximum(m_vec, x)
            seen = m_new > float("-inf")
            s_vec = tl.where(seen, s_vec * tl.exp(m_vec - m_new) + tl.exp(x - m_new), 0.0)
            m_vec = m_new
        m = tl.max(m_vec, 0)
        s = tl.sum(tl.where(m_vec > float("-inf"), s_vec * tl.exp(m_vec - m), 0.0), 0)
        lse = m + tl.log(s)
        t = tl.load(t_ptr + row)
        x_t = tl.load(base + t).to(tl.float32)
        tl.store(lse_ptr + row, lse)
        tl.store(out_ptr + row, x_t - lse)

    @triton.jit
    def _grad_kernel(x_ptr, t_ptr, lse_ptr, g_ptr, stride, V, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = x_ptr + row * stride
        cols = tl.arange(0, BLOCK)
        lse = tl.load(lse_ptr + row)
        g = tl.load(g_ptr + row)
        t = tl.load(t_ptr + row)
        for off in range(0, V, BLOCK):
            c = off + cols
            x = tl.load(base + c, mask=c < V, other=0.0).to(tl.float32)
            d = -g * tl.exp(x - lse)
            d = tl.where(c == t, d + g, d)
            tl.store(base + c, d.to(x_ptr.dtype.element_ty), mask=c < V)


def available(x: torch.Tensor) -> bool:
    """Whether ``x`` (logits) can use the kernels."""
    if not _HAVE_TRITON or x.dtype not in (torch.bfloat16, torch.float16):
        return False
    return x.is_cuda or _INTERPRET


def lse_pick(logits_CV: torch.Tensor, targets_C: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_softmax(logits)[target], logsumexp(logits))``, both float32 ``[C]``."""
    c, v = logits_CV.shape
    x = logits_CV if logits_CV.stride(1) == 1 else logits_CV.contiguous()
    lse_C = torch.empty(c, dtype=torch.float32, device=x.device)
    out_C = torch.empty_like(lse_C)
    if c:
        _lse_pick_kernel[(c,)](x, targets_C.contiguous(), lse_C, out_C, x.stride(0), v,
                               BLOCK=BLOCK, num_warps=8)
    return out_C, lse_C


def grad_into(logits_CV: torch.Tensor, targets_C: torch.Tensor, lse_C: torch.Tensor,
              grad_C: torch.Tensor) -> torch.Tensor:
    """Overwrite ``logits_CV`` (contiguous rows) with ``grad * d lp / d logits`` and return
    it: ``grad * (onehot(target) - softmax(logits))`` in the logits' dtype."""
    c, v = logits_CV.shape
    if logits_CV.stride(1) != 1:
        raise ValueError("grad_into needs logits with contiguous rows")
    if c:
        _grad_kernel[(c,)](logits_CV, targets_C.contiguous(), lse_C.contiguous(),
                           grad_C.to(torch.float32).contiguous(), logits_CV.stride(0), v,
                           BLOCK=BLOCK, num_warps=8)
    return logits_CV
