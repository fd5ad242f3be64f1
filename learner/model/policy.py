"""The trained policy: a Hugging Face causal LM and the log-probabilities of sampled tokens.

``token_logprobs`` returns ``logprobs_BT`` aligned with ``tokens_BT``: entry ``t`` (t >= 1) is
``log_softmax(logits[t-1] / temperature)[tokens[t]]``, exactly what the rollout servers record
as behavior log-probabilities; entry 0 is 0. Rows sampled with a top-p / top-k cut get the
log-probability under the same cut, renormalised (``gspo_rl.contract.sampling_dist``).

Memory: logits only from the first trained token on, a chunked selected-log-prob
(``_SelectedLogprob``) that keeps no float32 copy for backward, and, with a plain linear
output head (``fused_head_weight``), the fused head (``gspo_rl.learner.model.logprob_head``),
so that no ``[B, T, V]`` logits exist at all; with ``packing`` a microbatch goes through the
model as one packed row (``gspo_rl.learner.data.packing``). FSDP-sharded models keep the logits
path. Dropout is off: an importance ratio compares the learner's function with the sampler's.
Design notes: docs/design/learner-model.md.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gspo_rl.contract.attention import masked_sdpa_backends
from gspo_rl.contract.sampling_dist import sampled_logprobs, truncating
from gspo_rl.learner.data.packing import (
    pack_inputs,
    packed_selection,
    scatter_rows,
    target_positions,
)
from gspo_rl.learner.model.logprob_head import ChunkFn, fused_logprobs
from gspo_rl.learner.model.lora import load_model
from gspo_rl.learner.model.varlen import NAME as VARLEN

# Attentions that read a packed row's sequence offsets (``PackedRows.attention_kwargs``).
_OFFSET_ATTENTIONS = (VARLEN, "flash_attention_2")

# Row chunk of the logprob kernel: about 2**24 float32 elements (64 MiB) at a time.
_CHUNK_ELEMS = 2**24


def resolve_device(device: str) -> torch.device:
    """"auto" -> CUDA when available, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class _SelectedLogprob(torch.autograd.Function):
    """``log_softmax(logits / t)[target]`` for ``[N, V]`` logits, without ``[N, V]`` temporaries
    beyond one chunk; returns float32 ``[N]`` (float64 for float64 logits)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        logits_NV: torch.Tensor,
        targets_N: torch.Tensor,
        temperature_N: torch.Tensor,
    ) -> torch.Tensor:
        n, v = logits_NV.shape
        ft = torch.promote_types(logits_NV.dtype, torch.float32)  # float64 stays (gradcheck)
        out_N = torch.empty(n, dtype=ft, device=logits_NV.device)
        lse_N = torch.empty_like(out_N)
        step = max(1, _CHUNK_ELEMS // max(v, 1))
        for a in range(0, n, step):
            # Out of place: .to() is a no-op (no copy) when the dtype already matches.
            x = logits_NV[a:a + step].to(ft) / temperature_N[a:a + step, None]
            lse_N[a:a + step] = torch.logsumexp(x, dim=-1)
            out_N[a:a + step] = x.gather(1, targets_N[a:a + step, None]).squeeze(1)
        out_N -= lse_N
        ctx.save_for_backward(logits_NV, targets_N, temperature_N, lse_N)
        return out_N

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_N: torch.Tensor
    ) -> tuple[torch.Tensor, None, None]:
        logits_NV, targets_N, temperature_N, lse_N = ctx.saved_tensors  # type: ignore[attr-defined]  # autograd's ctx: set at run time
        grad_NV = torch.empty_like(logits_NV)
        n, v = logits_NV.shape
        step = max(1, _CHUNK_ELEMS // max(v, 1))
        for a in range(0, n, step):
            t = temperature_N[a:a + step, None]
            g = grad_N[a:a + step, None].to(lse_N.dtype)
            # d/dx_j [x_target - lse(x)] = 1[j = target] - softmax(x)_j ;  dx/dlogits = 1/t
            p = (logits_NV[a:a + step].to(lse_N.dtype) / t).sub_(lse_N[a:a + step, None]).exp_()
            p.mul_(-g).scatter_add_(1, targets_N[a:a + step, None], g).div_(t)
            grad_NV[a:a + step] = p
        return grad_NV, None, None


def selected_logprobs(
    logits_BKV: torch.Tensor, targets_BK: torch.Tensor, temperature_B: torch.Tensor
) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` at ``targets``: float32 ``[B, K]``."""
    b, k, v = logits_BKV.shape
    temp_N = temperature_B.to(torch.float32)[:, None].expand(b, k).reshape(-1)
    out_N = _SelectedLogprob.apply(logits_BKV.reshape(b * k, v), targets_BK.reshape(-1), temp_N)
    return out_N.view(b, k)


def cut_logprobs(
    logits_BKV: torch.Tensor, targets_BK: torch.Tensor, temperature_B: torch.Tensor,
    top_p_B: torch.Tensor | None, top_k_B: torch.Tensor | None,
) -> torch.Tensor:
    """``selected_logprobs``, except for rows sampled with a top-p / top-k cut: those get
    ``gspo_rl.contract.sampling_dist.sampled_logprobs`` (more memory: plain autograd over their
    ``[K, V]`` logits in row chunks). Float32 ``[B, K]``."""
    b, k, v = logits_BKV.shape
    dev = logits_BKV.device
    if top_p_B is None or top_k_B is None:
        return selected_logprobs(logits_BKV, targets_BK, temperature_B)
    cut_B = truncating(top_p_B.to(dev), top_k_B.to(dev), v)
    if not bool(cut_B.any()):
        return selected_logprobs(logits_BKV, targets_BK, temperature_B)
    out_BK = torch.zeros(b, k, dtype=torch.float32, device=dev)
    plain, rows = (~cut_B).nonzero()[:, 0], cut_B.nonzero()[:, 0]
    if plain.numel():
        out_BK = out_BK.index_put((plain,), selected_logprobs(
            logits_BKV[plain], targets_BK[plain], temperature_B[plain]))
    n = rows.numel()

    def per_token(x_R: torch.Tensor) -> torch.Tensor:
        return x_R.to(dev)[rows][:, None].expand(n, k).reshape(-1)

    lp_N = sampled_logprobs(logits_BKV[rows].reshape(n * k, v), targets_BK[rows].reshape(-1),
                            per_token(temperature_B.float()), per_token(top_p_B),
                            per_token(top_k_B))
    return out_BK.index_put((rows,), lp_N.view(n, k).float())


def _disable_dropout(model: nn.Module) -> None:
    """Every dropout off, except LoRA's adapter dropout (``lora_dropout``, 0 by default)."""
    for name, m in model.named_modules():
        if isinstance(m, nn.Dropout) and "lora_dropout" not in name:
            m.p = 0.0
    cfg = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop",
                 "attn_pdrop"):
        if cfg is not None and isinstance(getattr(cfg, name, None), float):
            setattr(cfg, name, 0.0)


def fused_head_weight(model: nn.Module) -> torch.Tensor | None:
    """The ``[V, D]`` output-projection weight when logits are exactly ``hidden @ W.T`` (a
    bias-free linear head, no logit scaling or soft-capping, not an FSDP-sharded DTensor);
    ``None`` otherwise (the policy then uses the model's own logits)."""
    from torch.distributed.tensor import DTensor

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[operator]  # nn.Module's attributes: Tensor | Module
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    cfg = getattr(model, "config", None)
    scaled = any(getattr(cfg, k, None) not in (None, 1.0)
                 for k in ("final_logit_softcapping", "logit_scale", "logits_scaling"))
    if (not isinstance(head, nn.Linear) or head.bias is not None or base is None or scaled
            or isinstance(head.weight, DTensor)):
        return None
    return head.weight


def prepare_for_training(model: nn.Module, gradient_checkpointing: bool, lora: bool) -> None:
    """No KV cache in training passes; gradient checkpointing when asked (under LoRA the
    frozen embeddings' output is made to require grad, so checkpointed inputs carry it)."""
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()  # type: ignore[operator]  # nn.Module's attributes: Tensor | Module
        if lora:
            model.enable_input_require_grads()  # type: ignore[operator]  # nn.Module's attributes: Tensor | Module
    model.config.use_cache = False  # type: ignore[union-attr]  # nn.Module's attributes: Tensor | Module


class Policy:
    """A causal LM in float32 with a memory-lean ``token_logprobs``."""

    def __init__(self, model: nn.Module, device: torch.device, bf16_autocast: bool = False,
                 packing: bool = False, peft: Any = None):
        self.model = model
        # With LoRA: the PeftModel around ``model`` (it saves the adapter); None otherwise.
        self.peft = peft
        self.device = device
        self.bf16_autocast = bf16_autocast and device.type == "cuda"
        self.packing = packing  # one packed row per microbatch (needs the fused-head path)
        _disable_dropout(model)
        model.train()  # gradient checkpointing is active only in train mode; dropout is off
        self._has_logits_to_keep = "logits_to_keep" in inspect.signature(
            model.forward).parameters

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str = "auto",
        bf16_autocast: bool = False,
        gradient_checkpointing: bool = False,
        lora: Any = None,
    ) -> Policy:
        """Load a Hugging Face model directory in float32 on ``device``. With ``lora`` (the
        ``LearnerConfig``, its ``lora_rank`` set) the base is frozen under LoRA adapters: those
        of ``path`` when it is an adapter directory (a LoRA checkpoint), else fresh ones. An
        adapter directory without ``lora`` loads merged into its base."""
        dev = resolve_device(device)
        model, peft = load_model(path, lora)
        model.to(dev)
        prepare_for_training(model, gradient_checkpointing, lora=peft is not None)
        return cls(model, dev, bf16_autocast=bf16_autocast, peft=peft)

    def _autocast(self):  # noqa: ANN202 - a context manager
        if self.bf16_autocast:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return nullcontext()

    def _attention(self):  # noqa: ANN202 - a context manager
        """A padded forward runs masked attention at a new length nearly every time: on CUDA
        without cuDNN attention (``gspo_rl.contract.attention``: ~1.1 s per new training length on
        an H100). Packed forwards have no mask (``gspo_rl.learner.model.varlen``)."""
        return nullcontext() if self.packing else masked_sdpa_backends(self.device)

    def token_logprobs(
        self,
        tokens_BT: torch.Tensor,
        attention_BT: torch.Tensor,
        temperature_B: torch.Tensor,
        mask_BT: torch.Tensor | None = None,
        top_p_B: torch.Tensor | None = None,
        top_k_B: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Float32 ``[B, T]`` log-probs of ``tokens_BT[:, t]`` given ``tokens_BT[:, :t]``.

        With ``mask_BT`` only columns from the first trained token on are computed; the others
        are 0. ``top_p_B`` / ``top_k_B``: each row's sampling cut (``cut_logprobs``).
        Differentiable when grad is enabled. Inputs may live on the CPU.
        """
        dev = self.device
        tokens_BT = tokens_BT.to(dev, non_blocking=True)
        attention_BT = attention_BT.to(dev, non_blocking=True)
        temperature_B = temperature_B.to(dev, torch.float32, non_blocking=True)
        if fused_head_weight(self.model) is not None:
            return self._hidden_logprobs(tokens_BT, attention_BT, temperature_B, mask_BT,
                                         top_p_B, top_k_B)
        B, T = tokens_BT.shape
        first = 1  # first target column that needs a logit
        if mask_BT is not None:
            cols = (mask_BT[:, 1:] > 0).any(0).nonzero()
            first = 1 + int(cols[0]) if cols.numel() else T
        if first >= T:
            return torch.zeros(B, T, dtype=torch.float32, device=dev)
        keep = T - first  # logits of input positions first-1 .. T-2
        kwargs: dict = {"use_cache": False}
        if self._has_logits_to_keep:
            kwargs["logits_to_keep"] = keep
        with self._autocast(), self._attention():
            out = self.model(input_ids=tokens_BT[:, :-1], attention_mask=attention_BT[:, :-1],
                             **kwargs)
        logits = out.logits[:, -keep:]
        lp_BK = cut_logprobs(logits, tokens_BT[:, first:], temperature_B, top_p_B, top_k_B)
        pad = torch.zeros(B, first, dtype=torch.float32, device=dev)
        return torch.cat([pad, lp_BK], dim=1)

    def _hidden_logprobs(
        self,
        tokens_BT: torch.Tensor,
        attention_BT: torch.Tensor,
        temperature_B: torch.Tensor,
        mask_BT: torch.Tensor | None,
        top_p_B: torch.Tensor | None = None,
        top_k_B: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``token_logprobs`` from hidden states at the selected positions only (``K`` of
        them) through the fused head; padded or packed forward."""
        B, T = tokens_BT.shape
        sel_BT = target_positions(attention_BT, mask_BT)
        if not bool(sel_BT.any()):
            return torch.zeros(B, T, dtype=torch.float32, device=self.device)
        base = getattr(self.model, self.model.base_model_prefix)  # type: ignore[call-overload]  # nn.Module's attributes: Tensor | Module
        with self._autocast(), self._attention():
            if self.packing:
                p = pack_inputs(tokens_BT, attention_BT)
                offsets = p.attention_kwargs() if getattr(
                    self.model.config, "_attn_implementation", None) in _OFFSET_ATTENTIONS else {}
                h_ND = base(input_ids=p.input_ids_1N, position_ids=p.position_ids_1N,
                            attention_mask=None, use_cache=False, **offsets).last_hidden_state[0]
                h_KD = h_ND[packed_selection(p, sel_BT)]
            else:
                h_KD = base(input_ids=tokens_BT[:, :-1], attention_mask=attention_BT[:, :-1],
                            use_cache=False).last_hidden_state[sel_BT]
        weight_VD = fused_head_weight(self.model)
        assert weight_VD is not None

        def per_token(x_B: torch.Tensor) -> torch.Tensor:
            return x_B.to(self.device)[:, None].expand(B, T - 1)[sel_BT]

        targets_K, temp_K = tokens_BT[:, 1:][sel_BT], per_token(temperature_B)
        h_KD = h_KD.to(weight_VD.dtype)
        cut = top_p_B is not None and top_k_B is not None and bool(
            truncating(top_p_B, top_k_B, weight_VD.shape[0]).any())
        if cut:  # the sampler's truncated distribution, chunk by chunk (it scales by T itself)
            assert top_p_B is not None and top_k_B is not None
            chunk_fn = _sampled_chunk_fn(temp_K, per_token(top_p_B), per_token(top_k_B))
            lp_K = fused_logprobs(h_KD, weight_VD, targets_K, chunk_fn)
        else:
            lp_K = fused_logprobs(h_KD, weight_VD, targets_K, temperature_N=temp_K)
        return scatter_rows(lp_K.float(), sel_BT)


def _sampled_chunk_fn(temp_K: torch.Tensor, top_p_K: torch.Tensor,
                      top_k_K: torch.Tensor) -> ChunkFn:
    """``gspo_rl.contract.sampling_dist.sampled_logprobs`` as the fused head's per-chunk function
    (rows without a cut get plain ``log_softmax(z / T)`` from it)."""

    def fn(logits_CV: torch.Tensor, targets_C: torch.Tensor, rows: slice) -> torch.Tensor:
        return sampled_logprobs(logits_CV, targets_C, temp_K[rows], top_p_K[rows],
                                top_k_K[rows])

    return fn
