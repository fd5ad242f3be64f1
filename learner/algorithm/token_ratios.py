"""A step's per-token log importance ratios, per rollout (no I/O): what the learner writes to
``Keys.token_ratios`` after each step (``gspo_rl.contract.ratios``), the dashboard's shading.

``LogRatios.add`` takes one microbatch's ``log(pi_prox / pi_behavior)`` ``[B, T]`` as the
trainer sets its pi_prox (row ``b`` is rollout ``rollout_ids[b]``: a packed forward still
returns the padded layout), kept on the device as float16; ``take`` copies them all to the CPU
once, at the step's end, and keeps each rollout's sampled tokens (loss mask > 0), in order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class LogRatios:
    """One step's log-ratios, collected microbatch by microbatch (module docstring)."""

    def __init__(self) -> None:
        self._parts: list[tuple[list[str], torch.Tensor, torch.Tensor]] = []

    def add(self, rollout_ids: Sequence[str], log_ratio_BT: torch.Tensor,
            mask_BT: torch.Tensor) -> None:
        """``log_ratio_BT``: prox - behavior of one microbatch (any device); ``mask_BT``: its
        loss mask on the CPU."""
        if len(rollout_ids) != log_ratio_BT.shape[0] or log_ratio_BT.shape != mask_BT.shape:
            raise ValueError(f"{len(rollout_ids)} rollouts, log-ratios {tuple(log_ratio_BT.shape)}"
                             f", mask {tuple(mask_BT.shape)}")
        flat = log_ratio_BT.detach().to(torch.float16).reshape(-1)
        self._parts.append((list(rollout_ids), mask_BT, flat))

    def take(self) -> dict[str, np.ndarray]:
        """rollout id -> float16 ``[K]``, its sampled tokens' log-ratios; empties the
        collection."""
        parts, self._parts = self._parts, []
        if not parts:
            return {}
        flat = torch.cat([p[2] for p in parts]).cpu().numpy()
        out: dict[str, np.ndarray] = {}
        offset = 0
        for ids, mask_BT, _ in parts:
            keep_BT = mask_BT.numpy() > 0
            block = flat[offset:offset + keep_BT.size].reshape(keep_BT.shape)
            offset += keep_BT.size
            for b, rid in enumerate(ids):
                out[rid] = block[b][keep_BT[b]]
        return out
