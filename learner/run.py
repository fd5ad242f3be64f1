"""Running the learner as a process: graceful-stop signals, and rank 0 vs the other ranks.

``run_learner`` is what ``gspo learn`` calls. SIGINT / SIGTERM ask the ``Learner`` to stop
after its current step (it checkpoints and acks on the way out); a second signal aborts at
once with ``KeyboardInterrupt`` (unacked groups are redelivered on the next start). Under
``torchrun`` rank 0 runs the learner and the other ranks follow it
(``gspo_rl.learner.follower``).
"""

from __future__ import annotations

import gc
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Protocol

from gspo_rl.learner.checkpoint.store import LearnerState
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.follower import follow
from gspo_rl.learner.loop import Learner
from gspo_rl.learner.parallel.distributed import DistContext, init_from_env
from gspo_rl.learner.weights.base import WeightSync

log = logging.getLogger(__name__)


class Stoppable(Protocol):
    """A training loop that stops after its current step when asked (``Learner``, and
    ``gspo sft``'s loop)."""

    @property
    def stop_requested(self) -> bool: ...

    def request_stop(self) -> None: ...


@contextmanager
def graceful_signals(learner: Stoppable) -> Iterator[None]:
    """SIGINT/SIGTERM request a graceful stop of ``learner``; a second one aborts
    (``KeyboardInterrupt``). The previous handlers are restored on exit."""
    def handler(signum: int, frame: FrameType | None) -> None:
        if learner.stop_requested:
            raise KeyboardInterrupt
        log.warning("signal %d: stopping after the current step", signum)
        learner.request_stop()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_learner(config: LearnerConfig, sync: WeightSync | None = None) -> LearnerState | None:
    """Build a ``Learner`` and run it with graceful-stop signal handlers. Under ``torchrun``
    rank 0 runs the learner and the other ranks follow it (``gspo_rl.learner.follower``);
    they return ``None``."""
    # "auto" with LoRA: a replica per rank (bf16 weights, packing; the trainable state is
    # small); fsdp2 when asked (a base too large for one device).
    mode = "allreduce" if config.lora_rank is not None and config.data_parallel == "auto" \
        else config.data_parallel
    dist = init_from_env(config.device, mode)
    try:
        return _run(config, sync, dist)
    finally:
        if dist is not None:
            import torch.distributed

            torch.distributed.destroy_process_group()
            # The trainer is gone with _run's frame, but reference cycles (FSDP2's hooks) can
            # keep its device mesh, and so a gloo process group, alive until the interpreter
            # exits; destroyed that late, its threads sometimes aborted the process
            # ("terminate called without an active exception", exit -6) after a finished run.
            gc.collect()


def _run(config: LearnerConfig, sync: WeightSync | None,
         dist: DistContext | None) -> LearnerState | None:
    if dist is not None and not dist.is_main:
        follow(config, dist)
        return None
    learner = Learner(config, sync=sync, dist=dist)
    with graceful_signals(learner):
        return learner.run()
