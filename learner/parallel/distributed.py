"""Data-parallel learner under ``torchrun``: the collective primitives every rank uses.

    torchrun --nproc-per-node 2 -m gspo_rl.cli learn --model ... --redis-url ...

Rank 0 is the learner of ``gspo_rl.learner.loop`` (reader, checkpoints, acks, weight pushes,
metrics); it tells the other ranks what to do with the typed messages of
``gspo_rl.learner.parallel.protocol``, and ranks > 0 act on them in
``gspo_rl.learner.follower``. This module holds only what both sides call: joining the job,
the broadcast, the gradient sums, the split of the work.

Contract: every rank plans the same step and takes its share of each minibatch's
microbatches; each microbatch's loss is scaled by its share of the *whole* minibatch and
gradients are summed across ranks, so the update is exactly the single-process one, whatever
the split (up to the order of float additions). Modes (``LearnerConfig.data_parallel``;
"auto": fsdp2 on CUDA, allreduce on CPU): "allreduce" (full replicas, one flat all-reduce per
optimizer step) and "fsdp2" (``gspo_rl.learner.parallel.fsdp``). Why not DDP:
docs/design/distributed.md.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)
_BUCKET_ELEMS = 2**24  # 64 MiB of float32 per all-reduce


@dataclass(frozen=True)
class DistContext:
    """This process's place in the data-parallel job."""

    rank: int
    world: int
    local_rank: int
    fsdp: bool = False  # parameters sharded with FSDP2 (else replicated, all-reduced grads)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's ``obj`` on every rank (pickled)."""
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (pickled), in rank order; None on the others."""
        out: list[Any] | None = [None] * self.world if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def sum_floats(self, values: list[float], device: torch.device) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over the ranks, in flat buckets; a missing gradient
        counts as zeros (a rank that had no microbatch)."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket: list[torch.Tensor] = []
        size = 0
        for p in params:
            grad = cast(torch.Tensor, p.grad)  # set above
            bucket.append(grad)
            size += grad.numel()
            if size >= _BUCKET_ELEMS:
                _reduce_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            _reduce_bucket(bucket)


def _reduce_bucket(grads: list[torch.Tensor]) -> None:
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in same])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in same:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def assign_owners(costs: list[int], world: int) -> list[int]:
    """Rank of each item: largest first to the least-loaded rank (ties: lowest rank)."""
    load = [0] * world
    owners = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda k: (load[k], k))
        owners[i] = r
        load[r] += costs[i]
    return owners


def init_from_env(device: str, data_parallel: str = "auto") -> DistContext | None:
    """Join the ``torchrun`` job described by the environment; ``None`` when not under one.
    gloo on CPU, nccl on CUDA (each rank on ``cuda:LOCAL_RANK``); ``data_parallel`` "auto"
    shards with FSDP2 on CUDA and all-reduces on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo",
                                timeout=datetime.timedelta(minutes=30))
    fsdp = data_parallel == "fsdp2" or (data_parallel == "auto" and cuda)
    return DistContext(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=local,
                       fsdp=fsdp)


def rank_device(device: str, ctx: DistContext) -> str:
    """Each rank's own GPU; CPU stays CPU."""
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return f"cuda:{ctx.local_rank}" if cuda else "cpu"
