"""Loading this rank's ``Policy`` (replicated, or sharded under FSDP2) and gathering a sharded
one's full weights into rank 0's copy: the steps every rank shares, used by the learner, its
followers (ranks > 0) and SFT."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gspo_rl.learner.parallel.distributed import DistContext, rank_device


def load_policy(path: str | Path, config: Any, ctx: DistContext | None) -> Any:
    """This rank's ``Policy`` of ``path``: replicated, or sharded under FSDP2."""
    from gspo_rl.learner.model.policy import Policy

    if ctx is None:
        return Policy.load(path, config.device, config.bf16_autocast,
                           config.gradient_checkpointing, lora=config)
    device = rank_device(config.device, ctx)
    if ctx.fsdp:
        from gspo_rl.learner.parallel.fsdp import load_sharded_policy

        return load_sharded_policy(path, config, torch.device(device))
    return Policy.load(path, device, config.bf16_autocast, config.gradient_checkpointing,
                       lora=config)


def export_full(trainer: Any, host: torch.nn.Module | None,
                with_optimizer: bool) -> dict | None:
    """Collective under FSDP2 (every rank, same arguments but ``host``): gather the weights
    into ``host`` (rank 0's copy) and, when asked, the trainer state (full on rank 0)."""
    from gspo_rl.learner.parallel.fsdp import gather_full

    gather_full(trainer.policy.model, host)
    return trainer.state_dict() if with_optimizer else None
