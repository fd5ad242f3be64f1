"""The broadcast data plane: buckets, exact bytes across processes, timeouts on dead ranks."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import socket
import struct
from pathlib import Path

import pytest
import torch

from gspo_rl.contract.net import interface_addresses
from gspo_rl.contract.weights.collective import (
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


def _tcp_listeners(pid: int) -> set[tuple[str, int]]:
    """(address, port) of the IPv4 TCP sockets process ``pid`` listens on (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
            hex_ip, hex_port = fields[1].split(":")
            found.add((socket.inet_ntoa(struct.pack("<I", int(hex_ip, 16))), int(hex_port, 16)))
    return found


def _joins_and_reports(addr: str, port: int, q: mp.Queue, done: mp.Queue) -> None:
    pg = make_process_group("gloo", addr, port, 1, 2, epoch=0, timeout_s=30)
    q.put(sorted(_tcp_listeners(os.getpid())))
    done.get(timeout=60)  # stay in the group until the test has looked
    del pg


@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="needs Linux /proc")
def test_gloo_listens_on_the_address_towards_the_master_not_the_hostnames():
    """Compose put a server on two networks; its hostname resolved to the one the learner is
    not on, gloo listened there and every weight push timed out. Each rank now listens on its
    address on the route to the rendezvous: the test picks a master address other than the
    one the hostname resolves to, so the old behaviour fails it."""
    try:
        hostname_addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        hostname_addr = None
    local = sorted(set(interface_addresses().values()) - {hostname_addr})
    if not local:
        pytest.skip("this machine has no second local IPv4 address")
    addr = "127.0.0.1" if "127.0.0.1" in local else local[0]
    port = free_port(addr)
    store = host_store(addr, port, timeout_s=30)
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    done: mp.Queue = ctx.Queue()
    p = ctx.Process(target=_joins_and_reports, args=(addr, port, q, done))
    p.start()
    pg = make_process_group("gloo", addr, port, 0, 2, epoch=0, timeout_s=30, store=store)
    theirs = q.get(timeout=60)
    ours = _tcp_listeners(os.getpid()) - {("0.0.0.0", port)}
    done.put("done")
    p.join(timeout=30)
    assert p.exitcode == 0
    assert theirs and {a for a, _ in theirs} == {addr}, theirs
    assert {a for a, p_ in ours if p_ != port} == {addr}, ours
    del pg
