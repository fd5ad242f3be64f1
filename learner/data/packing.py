"""Packing: a padded microbatch's sequences as one row, no padding tokens through the model.

A padded ``[B, T]`` batch spends ``B x T`` token slots on ``sum(lengths)`` real tokens. Packed,
the real tokens of every row are laid end to end in one ``[1, N]`` row with ``position_ids``
that restart at 0 for each sequence; attention must then stay inside each sequence
(variable-length attention). Hugging Face models read packing from the position ids when
``attention_mask`` is ``None``: ``flash_attention_2`` turns them into ``cu_seqlens`` (varlen
kernels, no mask), ``flex_attention`` into a block-sparse mask, ``sdpa``/``eager`` into a
dense block-diagonal causal mask (exact, used on the CPU; its ``N x N`` cost is why packing is
not the CPU default). ``gspo_rl.learner.model.varlen`` (the CUDA default without flash-attn) takes
the sequence offsets (``PackedRows.attention_kwargs``).

Every position's hidden state is the one the padded forward gives (same tokens before it,
same positions), so the log-probabilities are equal up to float rounding.

Notation: ``B`` rows, ``T`` padded columns, ``N`` packed tokens, ``K`` selected positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PackedRows:
    """Model inputs of one packed forward, and where its outputs go in the padded layout."""

    input_ids_1N: torch.Tensor  # int64 [1, N]
    position_ids_1N: torch.Tensor  # int64 [1, N], restarting at 0 per sequence
    real_BT: torch.Tensor  # bool [B, T-1]: input positions that were packed (row-major order)
    cu_seqlens_S1: torch.Tensor  # int32 [S+1]: where each packed sequence starts (S non-empty)
    max_len: int  # the longest packed sequence

    def attention_kwargs(self) -> dict[str, torch.Tensor | int]:
        """transformers' variable-length keywords (flash-attention names), for attentions
        that take the packing from offsets rather than from the position ids."""
        return {"cu_seq_lens_q": self.cu_seqlens_S1, "cu_seq_lens_k": self.cu_seqlens_S1,
                "max_length_q": self.max_len, "max_length_k": self.max_len}


def pack_inputs(tokens_BT: torch.Tensor, attention_BT: torch.Tensor) -> PackedRows:
    """The model inputs of every row, packed row after row: real tokens whose next token is
    real too (a row's last token predicts nothing, and causal attention makes the others'
    hidden states independent of it). Works for left or right padding."""
    att_BT = (attention_BT[:, :-1] > 0) & (attention_BT[:, 1:] > 0)
    pos_BT = att_BT.long().cumsum(1) - 1
    lengths_B = att_BT.sum(1)
    lengths_S = lengths_B[lengths_B > 0]
    cu_S1 = F.pad(lengths_S.cumsum(0), (1, 0)).to(torch.int32)
    max_len = int(lengths_S.max()) if lengths_S.numel() else 0
    return PackedRows(input_ids_1N=tokens_BT[:, :-1][att_BT][None],
                      position_ids_1N=pos_BT[att_BT][None], real_BT=att_BT,
                      cu_seqlens_S1=cu_S1, max_len=max_len)


def target_positions(attention_BT: torch.Tensor, mask_BT: torch.Tensor | None) -> torch.Tensor:
    """Bool ``[B, T-1]``: input position ``t`` whose next token ``t+1`` needs a log-prob (a
    trained token, or any real token without a mask)."""
    real_BT = (attention_BT[:, 1:] > 0) & (attention_BT[:, :-1] > 0)
    if mask_BT is None:
        return real_BT
    return real_BT & (mask_BT[:, 1:].to(real_BT.device) > 0)


def packed_selection(packed: PackedRows, sel_BT: torch.Tensor) -> torch.Tensor:
    """Bool ``[N]`` over the packed tokens: those whose position is selected in ``sel_BT``
    (which must be a subset of the packed positions)."""
    return sel_BT[packed.real_BT]


def scatter_rows(values_K: torch.Tensor, sel_BT: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` float32 with ``values_K`` at the targets of ``sel_BT`` (column ``t+1`` for
    input position ``t``), 0 elsewhere (column 0 always). Differentiable in ``values_K``."""
    b, t1 = sel_BT.shape
    body_BT = torch.zeros(b, t1, dtype=values_K.dtype, device=values_K.device)
    body_BT = body_BT.masked_scatter(sel_BT, values_K)
    return torch.cat([torch.zeros(b, 1, dtype=values_K.dtype, device=values_K.device),
                      body_BT], dim=1)
