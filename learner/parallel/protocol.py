"""What rank 0 tells the other ranks of a data-parallel job: typed messages, one per thing.

Rank 0 (``gspo_rl.learner.loop``) owns the queue; after each read it sends exactly one message, so
no rank waits on a collective longer than one read timeout (``gspo_rl.learner.follower``
acts on them):

- ``Resume(checkpoint)``: once, first: the checkpoint directory every rank loads (None: start
  from the base model);
- ``Train(groups)``: train one step on these ``ReadyGroup``s (every rank, the same step);
- ``Idle()``: the read came back empty, nothing to train;
- ``Gather(with_optimizer)``: join the FSDP2 gather of the full weights (and the optimiser
  state) that rank 0 needs for a push or a checkpoint;
- ``Stop()``: rank 0 is done; return.

Messages travel pickled over ``DistContext.broadcast``; ``receive`` refuses anything else, so
a message rank 0 forgot to type fails loudly on the first follower instead of being ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gspo_rl.learner.parallel.distributed import DistContext


@dataclass(frozen=True)
class Resume:
    checkpoint: str | None
    """The checkpoint directory to load weights and optimiser state from; None: the base."""


@dataclass(frozen=True)
class Train:
    groups: list[Any]
    """The ``ReadyGroup``s of this step, in rank 0's order (every rank plans the same step)."""


@dataclass(frozen=True)
class Idle:
    """An empty read: nothing to train this time."""


@dataclass(frozen=True)
class Gather:
    with_optimizer: bool
    """Also gather the optimiser state (a checkpoint); False: the weights only (a push)."""


@dataclass(frozen=True)
class Stop:
    """Rank 0 stopped (after its final checkpoint)."""


Message = Resume | Train | Idle | Gather | Stop
_MESSAGE_TYPES = (Resume, Train, Idle, Gather, Stop)


def send(ctx: DistContext, msg: Message) -> None:
    """Rank 0: broadcast ``msg`` to the other ranks (a collective: they must be receiving)."""
    if not ctx.is_main:
        raise RuntimeError(f"rank {ctx.rank} sent {msg!r}: only rank 0 sends")
    if not isinstance(msg, _MESSAGE_TYPES):
        raise TypeError(f"not a protocol message: {msg!r}")
    ctx.broadcast(msg)


def receive(ctx: DistContext) -> Message:
    """Ranks > 0: the next message of rank 0."""
    msg = ctx.broadcast()
    if not isinstance(msg, _MESSAGE_TYPES):
        raise TypeError(f"rank {ctx.rank} received {msg!r} from rank 0: not a protocol message")
    return msg
