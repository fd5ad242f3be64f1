"""The broadcast data plane: buckets, exact bytes across processes, timeouts on dead ranks."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from contract.weight_transport import (
    TensorMeta,
    host_store,
    make_process_group,
    plan_buckets,
    receive_tensors,
    send_tensors,
    tensor_metas,
)
from tests.conftest import free_port


def _named() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(64, 32, generator=g)),
        ("a.bias", torch.randn(32, generator=g)),
        ("b.half", torch.randn(16, 8, generator=g).to(torch.bfloat16)),
        ("c.big", torch.randn(300, 300, generator=g)),
        ("d.ids", torch.arange(10, dtype=torch.int64)),
    ]


def test_bucket_plan_groups_by_dtype_and_size():
    metas = tensor_metas(_named())
    plan = plan_buckets(metas, bucket_bytes=16 * 1024)
    assert [i for b in plan for i in b] == list(range(len(metas)))  # every tensor once, in order
    for b in plan:
        assert len({metas[i].dtype for i in b}) == 1
        if len(b) > 1:
            assert sum(metas[i].nbytes for i in b) <= 16 * 1024
    assert plan[0] == [0, 1]  # 8 KiB + 128 B share a bucket
    assert [3] in plan  # 360 KB exceeds the bucket: alone


def test_tensor_meta_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="cannot be broadcast"):
        tensor_metas([("x", torch.zeros(2, dtype=torch.complex64))])


def _receiver(port: int, world: int, rank: int, q: mp.Queue) -> None:
    metas = tensor_metas(_named())
    pg = make_process_group("gloo", "127.0.0.1", port, rank, world, epoch=3, timeout_s=30)
    got = {n: t.clone() for n, t in receive_tensors(pg, metas, 16 * 1024, timeout_s=30)}
    q.put({n: t.tolist() for n, t in got.items()})


@pytest.mark.parametrize("n_receivers", [1, 2])
def test_broadcast_is_bit_exact_across_processes(n_receivers):
    port = free_port()
    store = host_store("127.0.0.1", port, timeout_s=30)
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    world = 1 + n_receivers
    procs = [ctx.Process(target=_receiver, args=(port, world, r, q)) for r in range(1, world)]
    for p in procs:
        p.start()
    pg = make_process_group("gloo", "127.0.0.1", port, 0, world, epoch=3, timeout_s=30,
                            store=store)
    named = _named()
    sent = send_tensors(pg, named, 16 * 1024, timeout_s=30)
    assert sent == sum(t.numel() * t.element_size() for _, t in named)
    for _ in procs:
        got = q.get(timeout=60)
        for name, t in named:
            assert torch.equal(torch.tensor(got[name], dtype=t.dtype), t), name
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0


def _joins_then_dies(port: int) -> None:
    make_process_group("gloo", "127.0.0.1", port, 1, 2, epoch=0, timeout_s=30)
    # exits without taking part in the broadcast


@pytest.mark.timeout(90)  # a hang fails the test; the broadcast's own timeout is 3 s
def test_dead_rank_raises_within_timeout_instead_of_hanging():
    port = free_port()
    store = host_store("127.0.0.1", port, timeout_s=30)
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_joins_then_dies, args=(port,))
    p.start()
    pg = make_process_group("gloo", "127.0.0.1", port, 0, 2, epoch=0, timeout_s=30, store=store)
    p.join(timeout=60)
    with pytest.raises((RuntimeError, TimeoutError)):
        send_tensors(pg, [("x", torch.zeros(1000))], 1024, timeout_s=3)


def test_meta_nbytes():
    m = TensorMeta(name="x", dtype="bfloat16", shape=[3, 4])
    assert m.numel == 12 and m.nbytes == 24
