"""A fused, chunked hidden-state -> log-prob head: ``[N, V]`` logits never exist at once.

``fused_logprobs(hidden_ND, weight_VD, targets_N, chunk_fn, temperature_N)`` returns, for
each row ``n``, ``chunk_fn((hidden[n] / t[n]) @ weight.T, targets[n])``: by default
(``LogSoftmaxPick``) the log-probability ``log_softmax(logits / t)[target]`` the rollout
servers record. Forward and backward run one chunk of rows at a time (backward recomputes each
chunk's logits); the weight's gradient accumulates in float32. ``chunk_fn`` is the plug for
other per-token distributions: any differentiable ``(logits_CV, targets_C, rows) -> lp_C``,
``rows`` being the chunk's ``slice`` of the ``N`` rows.

Notation: ``N`` rows (tokens), ``D`` hidden size, ``V`` vocabulary, ``C`` rows of one chunk.
Design notes: docs/design/learner-model.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ChunkFn = Callable[[torch.Tensor, torch.Tensor, slice], torch.Tensor]

# About 2**26 logits per chunk: 256 MiB in float32, a few hundred rows at V = 152k (a matrix
# multiply that still fills a GPU).
CHUNK_ELEMS = 2**26
# bf16/fp16 on CUDA with the default log-softmax (the Triton kernels; a caller's
# ``chunk_fn`` keeps CHUNK_ELEMS): 2**28 logits (512 MiB; ~1,770 rows at V = 152k). Fewer
# chunks, fewer float32 read-modify-writes of the [V, D] weight gradient that every chunk
# adds to; the kernels keep no float32 [C, V] copy, so the peak stays one chunk of logits.
HALF_CHUNK_ELEMS = 2**28


class LogSoftmaxPick:
    """The default ``ChunkFn``: ``log_softmax(logits)[target]`` in float32 (float64 logits
    stay float64), with an analytic gradient (``grad_logits``) that the head uses instead of
    autograd: ``d lp / d logits = onehot(target) - softmax(logits)``. Both directions are one
    fused (log-)softmax kernel over the chunk, reading bf16 logits and writing float32 (no
    separate cast or scaling passes: the temperature is folded into the hidden states)."""

    def __call__(self, logits_CV: torch.Tensor, targets_C: torch.Tensor,
                 rows: slice) -> torch.Tensor:
        ft = torch.promote_types(logits_CV.dtype, torch.float32)
        lp_CV = torch.log_softmax(logits_CV, dim=-1, dtype=ft)
        return lp_CV.gather(1, targets_C[:, None]).squeeze(1)

    def grad_logits(self, logits_CV: torch.Tensor, targets_C: torch.Tensor, rows: slice,
                    grad_C: torch.Tensor) -> torch.Tensor:
        """``grad_C * d lp_C / d logits_CV``, in the logits' dtype."""
        ft = torch.promote_types(logits_CV.dtype, torch.float32)
        g_C1 = grad_C[:, None].to(ft)
        p_CV = torch.softmax(logits_CV, dim=-1, dtype=ft)
        p_CV.mul_(-g_C1).scatter_add_(1, targets_C[:, None], g_C1)
        return p_CV.to(logits_CV.dtype)


def _kernels():  # noqa: ANN202 - the module; imported on first use (it imports Triton)
    from gspo_rl.learner.model import head_kernels

    return head_kernels


def _kernels_for(x: torch.Tensor) -> bool:
    """Whether the Triton softmax passes apply (half logits on CUDA; Triton is never
    imported for the float32 / CPU path)."""
    return x.dtype in (torch.bfloat16, torch.float16) and _kernels().available(x)


def _rows_per_chunk(v: int, chunk_elems: int) -> int:
    return max(1, chunk_elems // max(v, 1))


class _FusedHead(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden_ND: torch.Tensor,
        weight_VD: torch.Tensor,
        targets_N: torch.Tensor,
        chunk_fn: ChunkFn,
        chunk_elems: int,
    ) -> torch.Tensor:
        n, v = hidden_ND.shape[0], weight_VD.shape[0]
        ft = torch.promote_types(hidden_ND.dtype, torch.float32)
        out_N = torch.empty(n, dtype=ft, device=hidden_ND.device)
        step = _rows_per_chunk(v, chunk_elems)
        # The default log-softmax on CUDA half logits: Triton kernels, the log-sum-exp kept.
        kernels = isinstance(chunk_fn, LogSoftmaxPick) and _kernels_for(hidden_ND)
        lse_N = torch.empty(n, dtype=torch.float32, device=hidden_ND.device) if kernels \
            else None
        for a in range(0, n, step):
            rows = slice(a, min(a + step, n))
            logits_CV = hidden_ND[rows] @ weight_VD.T
            if lse_N is not None:
                out_N[rows], lse_N[rows] = _kernels().lse_pick(logits_CV, targets_N[rows])
            else:
                out_N[rows] = chunk_fn(logits_CV, targets_N[rows], rows)
        ctx.save_for_backward(hidden_ND, weight_VD, targets_N, lse_N)  # type: ignore[arg-type]  # None is saved as None (torch's stub: Tensor)
        ctx.chunk_fn, ctx.step = chunk_fn, step  # type: ignore[attr-defined]  # autograd's ctx: set at run time
        return out_N

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_N: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
        hidden_ND, weight_VD, targets_N, lse_N = ctx.saved_tensors  # type: ignore[attr-defined]  # autograd's ctx: set at run time
        need_h, need_w = ctx.needs_input_grad[:2]  # type: ignore[attr-defined]  # autograd's ctx: set at run time
        n, step = hidden_ND.shape[0], ctx.step  # type: ignore[attr-defined]  # autograd's ctx: set at run time
        grad_h = torch.empty_like(hidden_ND) if need_h else None
        acc = torch.promote_types(weight_VD.dtype, torch.float32)
        grad_w = torch.zeros(weight_VD.shape, dtype=acc, device=weight_VD.device) \
            if need_w else None
        for a in range(0, n, step):
            rows = slice(a, min(a + step, n))
            h_CD = hidden_ND[rows]
            if lse_N is not None:
                g_CV = _kernels().grad_into(h_CD @ weight_VD.T, targets_N[rows], lse_N[rows],
                                              grad_N[rows])
            else:
                g_CV = _grad_logits(ctx.chunk_fn, h_CD @ weight_VD.T,  # type: ignore[attr-defined]  # autograd's ctx: set at run time
                                    targets_N[rows], rows, grad_N[rows])
            if grad_h is not None:
                grad_h[rows] = g_CV @ weight_VD
            if grad_w is not None:
                grad_w += g_CV.T @ h_CD
        if grad_w is not None:
            grad_w = grad_w.to(weight_VD.dtype)
        return grad_h, grad_w, None, None, None


def _grad_logits(chunk_fn: ChunkFn, logits_CV: torch.Tensor, targets_C: torch.Tensor,
                 rows: slice, grad_C: torch.Tensor) -> torch.Tensor:
    """``grad_C * d chunk_fn / d logits``: analytic when the function offers it, else by
    autograd through ``chunk_fn`` on this chunk alone."""
    analytic = getattr(chunk_fn, "grad_logits", None)
    if analytic is not None:
        return analytic(logits_CV, targets_C, rows, grad_C)
    with torch.enable_grad():
        x_CV = logits_CV.detach().requires_grad_(True)
        lp_C = chunk_fn(x_CV, targets_C, rows)
        (g_CV,) = torch.autograd.grad(lp_C, x_CV, grad_C.to(lp_C.dtype))
    return g_CV


def fused_logprobs(
    hidden_ND: torch.Tensor,
    weight_VD: torch.Tensor,
    targets_N: torch.Tensor,
    chunk_fn: ChunkFn | None = None,
    temperature_N: torch.Tensor | None = None,
    chunk_elems: int | None = None,
) -> torch.Tensor:
    """``chunk_fn((hidden / temperature) @ weight.T, targets)`` row by row, chunked (see the
    module doc); ``chunk_fn`` defaults to ``LogSoftmaxPick``.

    ``temperature_N`` is folded into the projection, ``logits / t = (hidden / t) @ weight.T``:
    with the default ``chunk_fn`` that is ``log_softmax(logits / t)[target]``, without a
    ``[C, V]`` division. A ``chunk_fn`` that applies the temperature itself gets ``None``.
    Returns ``[N]`` in float32 (float64 for float64 inputs); differentiable in ``hidden_ND``
    and ``weight_VD``.
    """
    if temperature_N is not None:
        hidden_ND = hidden_ND / temperature_N[:, None].to(hidden_ND.dtype)
    if hidden_ND.shape[0] == 0:
        # Keep the graph: a zero-sized result still back-propagates (zeros) to the inputs.
        return (hidden_ND.sum(-1) * 0.0).to(torch.promote_types(hidden_ND.dtype,
                                                                torch.float32))
    fn = chunk_fn if chunk_fn is not None else LogSoftmaxPick()
    if chunk_elems is None:  # the larger chunks only where the kernels keep no float32 copy
        kernels = chunk_fn is None and _kernels_for(hidden_ND)
        chunk_elems = HALF_CHUNK_ELEMS if kernels else CHUNK_ELEMS
    return _FusedHead.apply(hidden_ND, weight_VD, targets_N, fn, chunk_elems)
