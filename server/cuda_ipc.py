"""One-GPU weight passing: a learner and a server on the same GPU exchange CUDA IPC handles.

NCCL refuses two ranks on one device, so a learner and a rollout server sharing a GPU cannot
form the broadcast group. Instead the learner packs its weights into buckets on its GPU (the
bucket plan of ``server.weight_transport``), exports each bucket's CUDA allocation as an IPC
handle and posts them, as JSON, to ``POST /admin/weights/update_ipc``. The server (or its vLLM
worker) opens the handles on its own device index, copies the buckets into the model (one
device-to-device copy, no host round trip, no second process group), synchronises its device,
and only then answers: the learner keeps the buckets alive until that answer, then frees them
(``torch.cuda.ipc_collect``).

Why our own handles and not vLLM's IPC weight-transfer engine (``vllm.distributed.
weight_transfer.ipc_engine``):

- one wire format for both engines: the hf engine opens the handles in the server process, the
  vLLM engine in its worker, and both load through their existing all-or-nothing paths (the
  vLLM worker's layerwise reload; the hf engine's checked copy under its step lock);
- JSON, not pickle: vLLM's HTTP path ships ``reduce_tensor``'s pickled rebuild call, which
  the receiver must unpickle (code execution for any caller of the route; vLLM guards it with
  an opt-in flag). Here only numbers and base64 handle bytes cross the wire and the receiver
  calls ``rebuild_cuda_tensor`` itself;
- the same bucket plan and ``TensorMeta`` list as the broadcast, so the learner's push code
  and the server's name/shape checks are shared.

The choice of this path is ``server.weight_transport.choose_transport`` (same GPU UUID). The
message format and its encoding are pure and tested on CPU; opening handles needs CUDA.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence

import torch
from pydantic import BaseModel, Field

from server.weight_transport import (
    DEFAULT_BUCKET_BYTES,
    TensorMeta,
    plan_buckets,
    tensor_metas,
)


class CudaIpcBucket(BaseModel):
    """One bucket: a 1-D tensor in a shared CUDA allocation (``storage._share_cuda_()``)."""

    dtype: str
    numel: int = Field(ge=0)
    tensor_offset: int = Field(ge=0)
    """Offset of the bucket in its storage, in elements."""
    handle: str
    """base64 of the cudaIpcMemHandle of the allocation holding the storage."""
    storage_size_bytes: int = Field(ge=0)
    storage_offset_bytes: int = Field(ge=0)
    ref_counter_handle: str
    """base64 of the producer's shared-memory ref counter file name."""
    ref_counter_offset: int = Field(ge=0)
    event_handle: str
    """base64 of the cudaIpcEventHandle the consumer waits on before reading."""
    event_sync_required: bool


class IpcUpdateRequest(BaseModel):
    """Learner -> server on the same GPU: load these tensors, found in ``buckets``, as
    ``version``. ``tensors`` and ``bucket_bytes`` give the bucket plan, as for a broadcast."""

    version: int = Field(ge=0)
    tensors: list[TensorMeta] = Field(min_length=1)
    bucket_bytes: int = Field(default=DEFAULT_BUCKET_BYTES, gt=0)
    buckets: list[CudaIpcBucket] = Field(min_length=1)
    timeout_s: float = Field(default=120.0, gt=0, le=3600)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def bucket_message(shared: tuple, dtype: str, numel: int, tensor_offset: int) -> CudaIpcBucket:
    """The message of one bucket from ``storage._share_cuda_()``'s tuple (device, handle,
    size, offset, ref counter handle, ref counter offset, event handle, event sync)."""
    (_device, handle, size_bytes, offset_bytes, ref_handle, ref_offset,
     event_handle, event_sync) = shared
    return CudaIpcBucket(
        dtype=dtype, numel=numel, tensor_offset=tensor_offset, handle=_b64(handle),
        storage_size_bytes=int(size_bytes), storage_offset_bytes=int(offset_bytes),
        ref_counter_handle=_b64(ref_handle), ref_counter_offset=int(ref_offset),
        event_handle=_b64(event_handle or b""), event_sync_required=bool(event_sync))


def rebuild_args(bucket: CudaIpcBucket, device_index: int) -> tuple:
    """Arguments of ``torch.multiprocessing.reductions.rebuild_cuda_tensor`` for ``bucket``,
    opened on the receiver's ``device_index`` (its own number for the shared GPU: the two
    processes may see different CUDA_VISIBLE_DEVICES)."""
    meta = TensorMeta(name="bucket", dtype=bucket.dtype, shape=[bucket.numel])
    return (torch.Tensor, (bucket.numel,), (1,), bucket.tensor_offset,
            torch.storage.TypedStorage, meta.torch_dtype, device_index,
            base64.b64decode(bucket.handle), bucket.storage_size_bytes,
            bucket.storage_offset_bytes, False, base64.b64decode(bucket.ref_counter_handle),
            bucket.ref_counter_offset, base64.b64decode(bucket.event_handle) or None,
            bucket.event_sync_required)


def check_plan(req: IpcUpdateRequest) -> list[list[int]]:
    """The bucket plan of ``req``; raises ValueError when its buckets do not match it."""
    plan = plan_buckets(req.tensors, req.bucket_bytes)
    if len(plan) != len(req.buckets):
        raise ValueError(f"{len(req.buckets)} IPC buckets for a plan of {len(plan)}")
    for idx, bucket in zip(plan, req.buckets, strict=True):
        want = sum(req.tensors[i].numel for i in idx)
        if bucket.numel != want or bucket.dtype != req.tensors[idx[0]].dtype:
            raise ValueError(f"IPC bucket of {bucket.numel} {bucket.dtype} does not match "
                             f"the plan ({want} {req.tensors[idx[0]].dtype})")
    return plan


def split_buckets(metas: Sequence[TensorMeta], plan: list[list[int]],
                  buffers: Sequence[torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, view)`` of every tensor, sliced out of its bucket buffer."""
    for idx, buf in zip(plan, buffers, strict=True):
        offset = 0
        for i in idx:
            m = metas[i]
            yield m.name, buf[offset:offset + m.numel].view(m.shape)
            offset += m.numel


def open_buckets(req: IpcUpdateRequest, device: torch.device
                 ) -> list[tuple[str, torch.Tensor]]:
    """Receiver: open every handle on ``device`` (CUDA). The views alias the learner's memory:
    copy them into the model and synchronise before answering the learner."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if device.type != "cuda":
        raise ValueError(f"CUDA IPC weights need a CUDA engine, this one is on {device}")
    plan = check_plan(req)
    index = device.index if device.index is not None else torch.cuda.current_device()
    buffers = [rebuild_cuda_tensor(*rebuild_args(b, index)) for b in req.buckets]
    return list(split_buckets(req.tensors, plan, buffers))


def export_buckets(named: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int,
                   device: torch.device) -> tuple[list[TensorMeta], list[torch.Tensor],
                                                  list[CudaIpcBucket]]:
    """Sender: pack ``named`` into fresh buckets on ``device`` (CUDA) and export them. The
    caller keeps the returned buffers alive until the receiver has answered."""
    metas = tensor_metas(named)
    buffers: list[torch.Tensor] = []
    messages: list[CudaIpcBucket] = []
    for idx in plan_buckets(metas, bucket_bytes):
        parts = [named[i][1].detach().to(device).reshape(-1) for i in idx]
        buf = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
        storage = buf.untyped_storage()
        messages.append(bucket_message(storage._share_cuda_(), metas[idx[0]].dtype,
                                       buf.numel(), buf.storage_offset()))
        buffers.append(buf)
    torch.cuda.current_stream(device).synchronize()  # the buckets are written before we post
    return metas, buffers, messages
