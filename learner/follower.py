"""What ranks > 0 of a data-parallel job do (``gspo_rl.learner.parallel.distributed`` for the
collectives, ``gspo_rl.learner.parallel.protocol`` for the messages): load what rank 0 loaded, then
act on each message until ``Stop``. Ranks > 0 never touch Redis or the disk; rank 0 alone reads,
acknowledges, pushes and checkpoints. The steps every rank shares with rank 0 (loading its
``Policy``, joining the FSDP2 gather) are in ``gspo_rl.learner.parallel.loading``."""

from __future__ import annotations

import signal
from typing import Any

from gspo_rl.learner.parallel.distributed import DistContext
from gspo_rl.learner.parallel.loading import export_full, load_policy
from gspo_rl.learner.parallel.protocol import Gather, Idle, Resume, Stop, Train, receive


def follow(config: Any, ctx: DistContext) -> int:
    """The loop of ranks > 0: load what rank 0 loaded, then train every broadcast batch.
    Returns the number of steps trained."""
    from gspo_rl.learner.checkpoint.store import load_trainer_state
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
