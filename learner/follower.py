"""What ranks > 0 of a data-parallel job do (``gspo_rl.learner.parallel.distributed`` for the
collectives, ``gspo_rl.learner.parallel.protocol`` for the messages): load what rank 0 loaded, then
act on each message until ``Stop``. Ranks > 0 never touch Redis or the disk; rank 0 alone reads,
acknowledges, pushes and checkpoints. Also the two steps every rank shares with rank 0: loading its
``Policy`` (replicated or sharded) and joining the FSDP2 gather."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import torch

from gspo_rl.learner.parallel.distributed import DistContext, rank_device
from gspo_rl.learner.parallel.protocol import Gather, Idle, Resume, Stop, Train, receive


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


def follow(config: Any, ctx: DistContext) -> int:
    """The loop of ranks > 0: load what rank 0 loaded, then train every broadcast batch.
    Returns the number of steps trained."""
    from gspo_rl.learner.checkpoint import load_trainer_state
    from gspo_rl.learner.startup import seed_everything
    from gspo_rl.learner.trainer import Trainer

    # SIGINT/SIGTERM (torchrun forwards them): rank 0 decides when to stop and says so.
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: None)
    first = receive(ctx)
    if not isinstance(first, Resume):
        raise TypeError(f"rank {ctx.rank}: expected Resume first, got {first!r}")
    source = first.checkpoint
    # Seeded as rank 0 seeds before its load (``Learner._load_model``): fresh LoRA adapters
    # are random, and every rank must draw the same ones (a replica, or its shard of them).
    seed_everything(config.seed)
    policy = load_policy(source or config.model, config, ctx)
    trainer = Trainer(policy, config, dist=ctx)
    if source is not None:
        where = "cpu" if ctx.fsdp else policy.device  # FSDP keeps only its shard
        trainer.load_state_dict(load_trainer_state(source, map_location=where))
    steps = 0
    while True:
        msg = receive(ctx)
        match msg:
            case Stop():
                return steps
            case Train(groups=groups):
                trainer.step(groups)
                steps += 1
            case Gather(with_optimizer=with_optimizer):
                export_full(trainer, None, with_optimizer)
            case Idle():
                pass
            case Resume():
                raise TypeError(f"rank {ctx.rank}: Resume after the start: {msg!r}")
