"""The data plane of the weight broadcast: a process group and bucketed tensor broadcasts.

Rank 0 is the learner; ranks 1..N are the engine workers of every registered rollout server.
HTTP carries the control messages (``JoinRequest``, ``UpdateRequest``); this module moves the
bytes. Both sides import it, so the bucket plan is computed identically on each. The group is
a ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` built directly over a ``TCPStore``, created and
dropped as servers join or leave; every collective has the group's timeout. Tensors travel in
buckets: consecutive tensors of one dtype flattened into buffers of at most ``bucket_bytes``.

Where the bytes live is decided in one place, ``transport_device`` (NCCL: each end's GPU;
gloo: the CPU). A learner and a server on the same GPU use the CUDA IPC path of
``gspo_rl.contract.weights.cuda_ipc`` instead, chosen by ``choose_transport``. Why not the
default process group: docs/design/weight-sync.md.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal, cast

import torch
import torch.distributed as dist
from pydantic import BaseModel, Field

from gspo_rl.contract.net import interface_of, route_source_address
from gspo_rl.contract.weights.lora import LoraSpec

Backend = Literal["gloo", "nccl"]
Transport = Literal["gloo", "nccl", "ipc"]
DEFAULT_BUCKET_BYTES = 64 * 2**20
log = logging.getLogger(__name__)

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
    "uint8": torch.uint8, "bool": torch.bool,
}


class TensorMeta(BaseModel):
    """Name (Hugging Face checkpoint name), dtype and shape of one broadcast tensor."""

    name: str
    dtype: str
    shape: list[int]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.torch_dtype).element_size()


class JoinRequest(BaseModel):
    """Learner -> server: join the broadcast group ``epoch`` as ``rank`` of ``world_size``."""

    master_addr: str
    master_port: int = Field(gt=0, lt=65536)
    rank: int = Field(ge=1)
    world_size: int = Field(ge=2)
    backend: Backend = "gloo"
    epoch: int = Field(ge=0)
    timeout_s: float = Field(default=60.0, gt=0, le=3600)


class UpdateRequest(BaseModel):
    """Learner -> server: receive these tensors over group ``epoch``, load them as ``version``.
    With ``lora`` they are LoRA adapter tensors, merged into the server's base
    (``gspo_rl.contract.weights.lora``)."""

    epoch: int = Field(ge=0)
    version: int = Field(ge=0)
    tensors: list[TensorMeta] = Field(min_length=1)
    bucket_bytes: int = Field(default=DEFAULT_BUCKET_BYTES, gt=0)
    lora: LoraSpec | None = None


def transport_device(backend: Backend, device: torch.device | str) -> torch.device:
    """The device of one rank's broadcast buffers, given its compute ``device``.

    NCCL: that CUDA device itself (an index is filled in: NCCL binds a rank to one GPU). gloo:
    the CPU, whatever the compute device (the gloo path is the host-memory transport).
    """
    dev = torch.device(device)
    if backend == "gloo":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ValueError(f"the nccl weight broadcast needs a CUDA device, not {dev}: use "
                         "sync_backend gloo for servers or learners on CPUs")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def device_ids(device: torch.device | str) -> list[str]:
    """Identity of the physical device(s) behind ``device``: the GPU's UUID for CUDA (the same
    GPU has the same UUID in every process and container, whatever CUDA_VISIBLE_DEVICES
    numbers it), ``"cpu"`` otherwise."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return [dev.type]
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return [f"GPU-{torch.cuda.get_device_properties(index).uuid}"]


def choose_transport(backend: Backend, learner_devices: Sequence[str],
                     server_devices: Sequence[str]) -> Transport:
    """How the learner reaches one server: CUDA IPC when the server runs on exactly the
    learner's one GPU (NCCL cannot put two ranks on one device), else the configured
    broadcast backend. The only place this choice is made."""
    shared = [d for d in server_devices if d.startswith("GPU-")]
    if len(learner_devices) == 1 and shared and list(server_devices) == list(learner_devices):
        return "ipc"
    return backend


class TransportInfo(BaseModel):
    """Server -> learner (``GET /admin/weights/transport``): where its engine's weights live."""

    devices: list[str]
    """``device_ids`` of every device holding the engine's weights (one per worker)."""


def tensor_metas(named: Iterable[tuple[str, torch.Tensor]]) -> list[TensorMeta]:
    inverse = {v: k for k, v in _DTYPES.items()}
    out = []
    for name, t in named:
        if t.dtype not in inverse:
            raise ValueError(f"{name}: dtype {t.dtype} cannot be broadcast")
        out.append(TensorMeta(name=name, dtype=inverse[t.dtype], shape=list(t.shape)))
    return out


def plan_buckets(metas: Sequence[TensorMeta], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``metas`` per bucket: consecutive, one dtype, at most ``bucket_bytes``."""
    buckets: list[list[int]] = []
    size = 0
    for i, m in enumerate(metas):
        same_dtype = bool(buckets) and metas[buckets[-1][0]].dtype == m.dtype
        if not buckets or not same_dtype or size + m.nbytes > bucket_bytes:
            buckets.append([i])
            size = m.nbytes
        else:
            buckets[-1].append(i)
            size += m.nbytes
    return buckets


def make_process_group(
    backend: Backend,
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    epoch: int,
    timeout_s: float,
    store: dist.TCPStore | None = None,
) -> dist.ProcessGroup:
    """Build (blocking until every rank arrives, at most ``timeout_s``) one broadcast group.

    Rank 0 passes the ``TCPStore`` it hosts (``host_store``); other ranks connect to it. Each
    rebuild uses a fresh ``epoch`` so keys of an abandoned group never collide.
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(master_addr, master_port, world_size=None, is_master=False,
                              timeout=timeout, wait_for_workers=False)
    prefixed = dist.PrefixStore(f"gspo-weights/{epoch}", store)
    pg: dist.ProcessGroupNCCL | dist.ProcessGroupGloo  # Backends (below: as a ProcessGroup)
    if backend == "nccl":
        pin_nccl_interface(master_addr, master_port)
        pg = dist.ProcessGroupNCCL(prefixed, rank, world_size)  # type: ignore[call-arg]  # torch's stub omits the options' default
    elif os.environ.get("GLOO_SOCKET_IFNAME"):  # the user's choice: torch reads it here
        pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    else:
        pg = dist.ProcessGroupGloo(prefixed, rank, world_size,
                                   gloo_options(master_addr, master_port, timeout))
    # A Backend, used as a ProcessGroup: the same collectives (torch's stubs list them on
    # ProcessGroup only)
    return cast(dist.ProcessGroup, pg)


def gloo_options(master_addr: str, master_port: int,
                 timeout: datetime.timedelta) -> dist.ProcessGroupGloo._Options:  # type: ignore[name-defined]  # not in torch's stubs
    """Gloo's options with its device on this machine's address towards the rendezvous.

    By default gloo listens on the address its hostname resolves to and every rank connects to
    the others' listening addresses. A server on two networks (compose: ``backend`` with Redis
    and the learner, ``frontend`` with the environments) may resolve its hostname to the
    network the learner is not on; the learner's connects then time out and no weight ever
    arrives. The address on the route to ``master_addr`` is the one the learner (who hosts the
    store there) and the other ranks, reaching the same store, can reach back."""
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # not in torch's stubs
    opts._timeout = timeout
    address = route_source_address(master_addr, master_port)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=address) if address
                     else dist.ProcessGroupGloo.create_default_device()]
    return opts


def pin_nccl_interface(master_addr: str, master_port: int) -> None:
    """NCCL picks its socket interface (bootstrap, socket transport) by its own order, with the
    same risk as gloo's hostname on a machine with several networks: pin it, once per process
    and only where the user has not (``NCCL_SOCKET_IFNAME``), to the interface on the route to
    ``master_addr``. A loopback route (everything on one host) keeps NCCL's own choice."""
    if os.environ.get("NCCL_SOCKET_IFNAME"):
        return
    address = route_source_address(master_addr, master_port)
    name = interface_of(address) if address and not address.startswith("127.") else None
    if name is not None:
        os.environ["NCCL_SOCKET_IFNAME"] = f"={name}"  # "=": this exact interface
        log.info("NCCL_SOCKET_IFNAME=%s (the interface on the route to %s)", f"={name}",
                 master_addr)


def host_store(master_addr: str, master_port: int, timeout_s: float) -> dist.TCPStore:
    """The rendezvous store, hosted by rank 0 (the learner)."""
    return dist.TCPStore(master_addr, master_port, world_size=None, is_master=True,
                         timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


Poll = Callable[[], None]
"""Called every 20 ms while a bucket is on its way (its completion wakes the wait at once);
raising abandons the broadcast (the caller then disposes of the group)."""


def _broadcast(pg: dist.ProcessGroup, buf: torch.Tensor, timeout_s: float,
               poll: Poll | None = None) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.timeout = datetime.timedelta(seconds=timeout_s)
    work = pg.broadcast([buf], opts)
    if poll is not None:  # wait in slices: the other side's failure ends the wait at once
        done = threading.Event()
        work.get_future().add_done_callback(lambda _: done.set())  # wakes the wait at once
        deadline = time.monotonic() + timeout_s
        while not done.wait(0.02):
            if time.monotonic() > deadline:
                raise TimeoutError(f"weight broadcast did not finish within {timeout_s}s")
            poll()
    if not work.wait(datetime.timedelta(seconds=timeout_s)):
        raise TimeoutError(f"weight broadcast did not finish within {timeout_s}s")


def send_tensors(
    pg: dist.ProcessGroup,
    named: Sequence[tuple[str, torch.Tensor]],
    bucket_bytes: int,
    timeout_s: float,
    device: torch.device | str = "cpu",
    poll: Poll | None = None,
) -> int:
    """Rank 0: broadcast ``named`` bucket by bucket. Returns the number of bytes sent.
    ``poll`` (see ``Poll``) is called while each bucket is under way."""
    metas = tensor_metas(named)
    sent = 0
    for idx in plan_buckets(metas, bucket_bytes):
        parts = [named[i][1].detach().to(device).reshape(-1) for i in idx]
        buf = parts[0] if len(parts) == 1 else torch.cat(parts)
        _broadcast(pg, buf.contiguous(), timeout_s, poll)
        sent += buf.numel() * buf.element_size()
    return sent


def receive_tensors(
    pg: dist.ProcessGroup,
    metas: Sequence[TensorMeta],
    bucket_bytes: int,
    timeout_s: float,
    device: torch.device | str = "cpu",
) -> Iterator[tuple[str, torch.Tensor]]:
    """Ranks >= 1: receive the buckets of ``metas``; yields ``(name, tensor)`` in order."""
    for idx in plan_buckets(metas, bucket_bytes):
        dtype = metas[idx[0]].torch_dtype
        buf = torch.empty(sum(metas[i].numel for i in idx), dtype=dtype, device=device)
        _broadcast(pg, buf, timeout_s)
        offset = 0
        for i in idx:
            m = metas[i]
            yield m.name, buf[offset:offset + m.numel].view(m.shape)
            offset += m.numel
