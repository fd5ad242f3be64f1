"""The hf engine's running batch on the device: its KV cache and per-row decode state.

Rows are left-aligned by padding (``hf_batch``): every row's cache ends at the last column,
``mask_BT`` marks each row's real columns, ``pos_B`` is the position id of each row's pending
token, and ``pending_B`` that token (sampled, not yet in the cache). The engine's scheduler
thread owns one ``RunningKV`` and keeps the requests (``rows``) in the same order; this class
holds only tensors and does no sampling. Shape letters as in ``hf_batch``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from gspo_rl.server.engines.hf import batch as hf_batch


class RunningKV:
    """KV cache, attention mask, position ids and pending tokens of the running rows."""

    def __init__(self, model: torch.nn.Module, pad_id: int, device: torch.device) -> None:
        self.model = model
        self.pad_id = pad_id
        self.device = device
        self.cache: DynamicCache | None = None
        self.mask_BT: torch.Tensor | None = None
        self.pending_B: torch.Tensor | None = None  # last sampled token, not yet in the cache
        self.pos_B: torch.Tensor | None = None  # position id of the pending token

    def prefill(self, prompts: Sequence[Sequence[int]], merge: bool) -> torch.Tensor:
        """Run ``prompts`` as one left-padded batch and add them after the running rows
        (``merge``) or in their place; returns their last logits ``[B_new, V]``."""
        cache, mask_BT, pos_B, logits_BV = self._forward(prompts)
        if not merge or self.cache is None:
            self.cache, self.mask_BT, self.pos_B = cache, mask_BT, pos_B
            self.pending_B = torch.zeros_like(pos_B)
        else:
            assert self.mask_BT is not None and self.pos_B is not None
            assert self.pending_B is not None
            self.mask_BT = hf_batch.merge(self.cache, self.mask_BT, cache, mask_BT)
            self.pos_B = torch.cat([self.pos_B, pos_B])
            self.pending_B = torch.cat([self.pending_B, torch.zeros_like(pos_B)])
        return logits_BV

    def recompute(self, seqs: Sequence[Sequence[int]]) -> None:
        """Rebuild the cache of the running rows from their tokens (``seqs``: prompt and
        completion but the pending token, in row order) with the current weights."""
        self.cache, self.mask_BT, self.pos_B, _ = self._forward(seqs)

    def _forward(self, seqs: Sequence[Sequence[int]]
                 ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``seqs`` as one left-padded batch into a fresh cache: the cache, its mask, each
        row's next position id and its last logits ``[B, V]``."""
        ids_BT, mask_BT, pos_BT = hf_batch.left_pad(seqs, self.pad_id, self.device)
        cache = DynamicCache(config=self.model.config)  # type: ignore[arg-type]  # nn.Module's attributes: Tensor | Module
        out = self.model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=pos_BT,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.past_key_values, mask_BT, pos_BT[:, -1] + 1, out.logits[:, -1]

    def decode(self) -> torch.Tensor:
        """One step for every row (its pending token into the cache); logits ``[B, V]``."""
        assert self.mask_BT is not None and self.pending_B is not None
        assert self.pos_B is not None
        self.mask_BT = torch.nn.functional.pad(self.mask_BT, (0, 1), value=1)
        out = self.model(input_ids=self.pending_B[:, None], attention_mask=self.mask_BT,
                         position_ids=self.pos_B[:, None], past_key_values=self.cache,
                         use_cache=True)
        self.cache = out.past_key_values
        self.pos_B = self.pos_B + 1
        return out.logits[:, -1]

    def set_pending(self, offset: int, token_ids_B: torch.Tensor) -> None:
        """The tokens just sampled for rows ``offset..``."""
        assert self.pending_B is not None
        self.pending_B[offset:] = token_ids_B

    def keep(self, keep: list[int]) -> None:
        """Keep only the rows at ``keep`` (in order), and drop cache columns none of them
        attends to; nothing left: empty."""
        if not keep:
            self.cache = self.mask_BT = self.pending_B = self.pos_B = None
            return
        assert self.mask_BT is not None and self.pending_B is not None
        assert self.pos_B is not None and self.cache is not None
        keep_B = torch.tensor(keep, device=self.device)
        hf_batch.select_rows(self.cache, keep_B)
        self.mask_BT, self.pending_B = self.mask_BT[keep_B], self.pending_B[keep_B]
        self.pos_B = self.pos_B[keep_B]
        used_T = self.mask_BT.any(dim=0)
        first = int(torch.nonzero(used_T)[0]) if bool(used_T.any()) else 0
        hf_batch.drop_left_columns(self.cache, first)
        self.mask_BT = self.mask_BT[:, first:]
