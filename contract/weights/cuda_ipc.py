"""One-GPU weight passing: a learner and a server on the same GPU exchange CUDA IPC handles.

NCCL refuses two ranks on one device, so a learner and a rollout server sharing a GPU cannot
form the broadcast group. Instead the learner exports each weight tensor's CUDA allocation as
an IPC handle and posts the handles, as JSON, to ``POST /admin/weights/update_ipc``. The
server (or its vLLM worker) opens them on its own device index, copies the tensors into the
model, synchronises its device, and only then answers; the learner is blocked in the push
until then, so no optimizer step writes the shared parameters while the server reads. Only
numbers and base64 handle bytes cross the wire (no pickle), with the same ``TensorMeta`` list
as the broadcast.

The choice of this path is ``gspo_rl.contract.weights.collective.choose_transport`` (same GPU
UUID). The message format and its encoding are pure and tested on CPU; opening handles needs
CUDA. Why not vLLM's IPC weight-transfer engine: docs/design/weight-sync.md.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, cast

import torch
from pydantic import BaseModel, Field

from gspo_rl.contract.weights.collective import TensorMeta, tensor_metas
from gspo_rl.contract.weights.lora import LoraSpec


class CudaIpcTensor(BaseModel):
    """One contiguous tensor in a shared CUDA allocation (``storage._share_cuda_()``)."""

    tensor_offset: int = Field(ge=0)
    """Offset of the tensor in its storage, in elements."""
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
    """Learner -> server on the same GPU: load ``tensors`` (names, dtypes, shapes), found at
    ``handles`` (one each, in order), as ``version``."""

    version: int = Field(ge=0)
    tensors: list[TensorMeta] = Field(min_length=1)
    handles: list[CudaIpcTensor] = Field(min_length=1)
    timeout_s: float = Field(default=120.0, gt=0, le=3600)
    lora: LoraSpec | None = None
    """Set: the tensors are LoRA adapter tensors (``gspo_rl.contract.weights.lora``)."""


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def handle_message(shared: tuple[Any, ...], tensor_offset: int) -> CudaIpcTensor:
    """The message of one tensor from ``storage._share_cuda_()``'s tuple (device, handle,
    size, offset, ref counter handle, ref counter offset, event handle, event sync)."""
    (_device, handle, size_bytes, offset_bytes, ref_handle, ref_offset,
     event_handle, event_sync) = shared
    return CudaIpcTensor(
        tensor_offset=tensor_offset, handle=_b64(handle),
        storage_size_bytes=int(size_bytes), storage_offset_bytes=int(offset_bytes),
        ref_counter_handle=_b64(ref_handle), ref_counter_offset=int(ref_offset),
        event_handle=_b64(event_handle or b""), event_sync_required=bool(event_sync))


def rebuild_args(meta: TensorMeta, msg: CudaIpcTensor, device_index: int) -> tuple[Any, ...]:
    """Arguments of ``torch.multiprocessing.reductions.rebuild_cuda_tensor`` for one tensor,
    opened on the receiver's ``device_index`` (its own number for the shared GPU: the two
    processes may see different CUDA_VISIBLE_DEVICES)."""
    strides: list[int] = []
    acc = 1
    for d in reversed(meta.shape):  # contiguous strides of the shape
        strides.insert(0, acc)
        acc *= d
    return (torch.Tensor, tuple(meta.shape), tuple(strides), msg.tensor_offset,
            torch.storage.TypedStorage, meta.torch_dtype, device_index,
            base64.b64decode(msg.handle), msg.storage_size_bytes, msg.storage_offset_bytes,
            False, base64.b64decode(msg.ref_counter_handle), msg.ref_counter_offset,
            base64.b64decode(msg.event_handle) or None, msg.event_sync_required)


def check_request(req: IpcUpdateRequest) -> None:
    """ValueError unless every tensor has one handle whose storage can hold it."""
    if len(req.handles) != len(req.tensors):
        raise ValueError(f"{len(req.handles)} IPC handles for {len(req.tensors)} tensors")
    for meta, msg in zip(req.tensors, req.handles, strict=True):
        itemsize = torch.empty((), dtype=meta.torch_dtype).element_size()
        if (msg.tensor_offset + meta.numel) * itemsize > msg.storage_size_bytes:
            raise ValueError(f"{meta.name}: {meta.numel} x {meta.dtype} at offset "
                             f"{msg.tensor_offset} overruns its shared storage "
                             f"({msg.storage_size_bytes} bytes)")


def open_tensors(req: IpcUpdateRequest, device: torch.device
                 ) -> list[tuple[str, torch.Tensor]]:
    """Receiver: open every handle on ``device`` (CUDA). The tensors alias the learner's
    memory: copy them into the model and synchronise before answering the learner."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if device.type != "cuda":
        raise ValueError(f"CUDA IPC weights need a CUDA engine, this one is on {device}")
    check_request(req)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return [(meta.name, rebuild_cuda_tensor(*rebuild_args(meta, msg, index)))  # type: ignore[no-untyped-call]  # torch: unannotated
            for meta, msg in zip(req.tensors, req.handles, strict=True)]


def export_tensors(named: Sequence[tuple[str, torch.Tensor]], device: torch.device
                   ) -> tuple[list[TensorMeta], list[torch.Tensor], list[CudaIpcTensor]]:
    """Sender: IPC handles of ``named`` on ``device`` (CUDA), shared in place when they are
    contiguous tensors there already (the usual case: no extra memory), else via a copy. The
    caller keeps the returned tensors alive until the receiver has answered."""
    metas = tensor_metas(named)
    kept: list[torch.Tensor] = []
    messages: list[CudaIpcTensor] = []
    for _, t in named:
        shared = t.detach().to(device).contiguous()
        messages.append(handle_message(shared.untyped_storage()._share_cuda_(),  # type: ignore[no-untyped-call]  # torch: unannotated
                                       cast(int, shared.storage_offset())))  # (not traced: an int)
        kept.append(shared)
    torch.cuda.current_stream(device).synchronize()  # every copy written before we post
    return metas, kept, messages
