"""The rank-0 -> follower protocol (gspo_rl.learner.parallel.protocol) over a real 2-process gloo
group: typed messages arrive as sent, an untyped one is refused; and acknowledgement has one owner
(``GroupReader``): no other learner module sends XACK."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from gspo_rl.learner.parallel.distributed import DistContext
from gspo_rl.learner.parallel.protocol import Gather, Idle, Resume, Stop, Train, receive, send

REPO = Path(__file__).resolve().parents[3]
SENT = [Resume("/ckpt/step-3"), Train(["g0", "g1"]), Idle(), Gather(True), Stop()]


def _rank(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    ctx = DistContext(rank=rank, world=2, local_rank=rank)
    try:
        if rank == 0:
            for msg in SENT:
                send(ctx, msg)
            ctx.broadcast(("train", []))  # the old untyped tuple
            return
        got = [receive(ctx) for _ in SENT]
        try:
            receive(ctx)
            refused = "accepted"
        except TypeError as exc:
            refused = str(exc)
        Path(out_dir, "got.txt").write_text(repr(got) + "\n" + refused)
    finally:
        dist.destroy_process_group()


def test_messages_arrive_typed_and_untyped_ones_are_refused(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    got, refused = (tmp_path / "got.txt").read_text().split("\n", 1)
    assert got == repr(SENT)
    assert "not a protocol message" in refused


def test_only_rank_0_sends_and_only_messages() -> None:
    with pytest.raises(RuntimeError):
        send(DistContext(rank=1, world=2, local_rank=1), Idle())
    with pytest.raises(TypeError):
        send(DistContext(rank=0, world=2, local_rank=0), ("idle",))  # type: ignore[arg-type]


def test_the_reader_is_the_only_learner_module_that_acknowledges() -> None:
    """The learner acknowledges only through the ready stream's reader (in the protocol)."""
    ackers = sorted(str(p.relative_to(REPO)) for folder in ("learner", "contract", "redisq")
                    for p in (REPO / folder).rglob("*.py")
                    if re.search(r"\.xack\(", p.read_text()))
    assert ackers == ["redisq/ready/reader.py"]
