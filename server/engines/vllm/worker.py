"""Runs inside vLLM's worker processes: the receiving end of the weight broadcast.

vLLM imports this module by path (``worker_extension_cls``) in every worker before it builds
the model, so importing it registers our weight-transfer backend with vLLM's
``WeightTransferEngineFactory`` in the process that needs it. ``GspoWeightTransferEngine``
(backend ``"gspo"``) plugs into vLLM's weight-transfer API and speaks the learner's wire
format: the bucketed broadcasts of ``gspo_rl.contract.weights.collective`` over a
``ProcessGroupGloo`` (CPU) or ``ProcessGroupNCCL`` (GPU) built on the learner's ``TCPStore``.

Contract: ``update_weights`` only starts receiving, in a thread, so generation goes on during
the transfer; ``finish_weight_update`` loads the complete staged set, or nothing if the
receive failed or was abandoned: a broadcast that dies half-way never leaves mixed weights.
The server process polls ``gspo_transfer_status`` to wait with its own deadline. After every
reload the CPU-packed copy of a tied ``lm_head`` is rebuilt from the shared embedding. Why
these departures from vLLM's own engines: docs/design/vllm-engine.md.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from gspo_rl.contract.weights.collective import (
    TensorMeta,
    device_ids,
    make_process_group,
    receive_tensors,
    transport_device,
)
from gspo_rl.server.engines.vllm import native_lora
from gspo_rl.server.engines.vllm.adapter import WorkerAdapters

BACKEND = "gspo"


@dataclass
class GspoInitInfo(WeightTransferInitInfo):
    """A ``JoinRequest`` as vLLM passes it: worker ``i`` of this server takes ``rank + i``."""

    backend: str
    master_addr: str
    master_port: int
    rank: int
    world_size: int
    epoch: int
    timeout_s: float


@dataclass
class GspoUpdateInfo(WeightTransferUpdateInfo):
    """An ``UpdateRequest``: the tensors (``TensorMeta`` dicts) in the learner's bucket plan."""

    epoch: int
    tensors: list[dict[str, Any]]
    bucket_bytes: int
    timeout_s: float
    lora: dict[str, Any] | None = None  # a LoRA adapter push (LoraSpec fields)


class _Job:
    """One background operation (a rendezvous or a receive) and how it ended."""

    def __init__(self, target: Any, name: str) -> None:
        self.result: Any = None
        self.error: str | None = None
        self.abandoned = False

        def run() -> None:
            try:
                self.result = target()
            except BaseException as exc:  # reported through status(), never lost
                self.error = f"{type(exc).__name__}: {exc}"

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    @property
    def ok(self) -> bool:
        return self.done and self.error is None and not self.abandoned


def refresh_tied_lm_head(model: torch.nn.Module) -> bool:
    """Re-pack ``lm_head`` from its (shared) weight on CPU.

    vLLM CPU keeps a pre-packed copy of every linear weight (``layer.cpu_linear``). A tied
    ``lm_head`` shares the embedding's Parameter but receives no weights of its own on a
    reload, so its packed copy would keep the old output projection.
    """
    head = getattr(model, "lm_head", None)
    if head is None or not hasattr(head, "cpu_linear") or getattr(head, "weight", None) is None:
        return False
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(head, remove_weight=False)
    return True


def reload_in_place(vllm_config: Any, model: torch.nn.Module,
                    named: list[tuple[str, torch.Tensor]]) -> None:
    """vLLM's layerwise in-place reload (HF checkpoint names), then the tied-head fix."""
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    reload_weights(vllm_config, model, weights_iterator=named, weights_path=None,
                   is_checkpoint_format=True)
    refresh_tied_lm_head(model)


class GspoWeightTransferEngine(WeightTransferEngine[GspoInitInfo, GspoUpdateInfo]):
    """The learner's bucketed broadcast, received in a thread, loaded all at once."""

    init_info_cls = GspoInitInfo
    update_info_cls = GspoUpdateInfo
    defers_processing = True  # update_weights returns once receiving has started
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device,
                 model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._join: _Job | None = None
        self._join_epoch: int | None = None
        self._join_backend: str = "gloo"
        self._receive: _Job | None = None

    # ------------------------------------------------------------ group

    def init_transfer_engine(self, init_info: GspoInitInfo) -> None:
        if init_info.backend not in ("gloo", "nccl"):
            raise ValueError(f"unknown broadcast backend {init_info.backend!r}")
        rank = init_info.rank + self.parallel_config.rank
        info = init_info
        self._join_epoch, self._join_backend = info.epoch, info.backend
        self._join = _Job(lambda: make_process_group(
            cast(Literal["gloo", "nccl"], info.backend),  # checked above
            info.master_addr, info.master_port, rank, info.world_size,
            info.epoch, info.timeout_s), name=f"gspo-join-{info.epoch}")

    def _group(self, epoch: int) -> Any:
        if self._join is None or self._join_epoch != epoch or not self._join.ok:
            raise RuntimeError(f"not a member of broadcast group epoch {epoch} "
                               f"(member of {self._join_epoch if self._join else None})")
        return self._join.result

    # ------------------------------------------------------------ update session

    def start_weight_update(self) -> None:
        """Forget any earlier staged set; the model stays live until everything arrived."""
        self._receive = None

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # No accelerator sync here (the base class has one): nothing is loaded yet.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GspoUpdateInfo) -> None:
        pg = self._group(update_info.epoch)
        metas = [TensorMeta(**t) for t in update_info.tensors]
        # NCCL: straight into this worker's GPU; gloo: host memory
        # (gspo_rl.contract.weights.collective)
        info = update_info
        device = transport_device("nccl" if self._join_backend == "nccl" else "gloo",
                                  self.device)

        def receive() -> list[tuple[str, torch.Tensor]]:
            return list(receive_tensors(pg, metas, info.bucket_bytes, info.timeout_s, device))

        self._receive = _Job(receive, name=f"gspo-receive-{update_info.epoch}")
        self._lora = info.lora

    def abandon(self) -> None:
        """The server gave up waiting: whatever arrives is dropped, nothing is loaded."""
        if self._receive is not None:
            self._receive.abandoned = True

    def finish_weight_update(self) -> None:
        """Load the staged tensors if (and only if) all of them arrived. Never raises for a
        failed receive, so vLLM's worker always leaves its update session."""
        job, self._receive = self._receive, None
        if job is None or not job.ok:
            return
        load_update(self.vllm_config, self.model, job.result, getattr(self, "_lora", None))

    def status(self) -> dict[str, Any]:
        join, rec = self._join, self._receive
        return {
            "epoch": self._join_epoch,
            "joined": bool(join and join.ok),
            "join_error": join.error if join and join.done else None,
            "received": bool(rec and rec.ok),
            "receiving": bool(rec and not rec.done),
            "receive_error": rec.error if rec and rec.done else None,
        }

    def shutdown(self) -> None:
        self.abandon()
        self._join = None
        self._join_epoch = None


def load_update(vllm_config: Any, model: torch.nn.Module,
                named: list[tuple[str, torch.Tensor]], lora: dict[str, Any] | None) -> int:
    """Load a received push: full weights in place; an adapter into vLLM's LoRA manager when
    the engine serves adapters natively (``native_lora``), else merged into the base."""
    native = vllm_config.lora_config is not None
    if lora is not None and native:
        return native_lora.install(model, named, lora)
    if lora is not None:
        named = adapters_of(vllm_config, model).merged(named, lora)
    reload_in_place(vllm_config, model, named)
    if native:  # new base weights under the served adapter
        native_lora.restore(model)
    return len(named)


def adapters_of(vllm_config: Any, model: torch.nn.Module) -> WorkerAdapters:
    """This worker's ``WorkerAdapters`` (made at the first adapter push, kept on the model)."""
    found = getattr(model, "_gspo_adapters", None)
    if found is None:
        packed = {k: list(v) for k, v in (getattr(model, "packed_modules_mapping", {}) or {})
                  .items()}
        found = WorkerAdapters(vllm_config.model_config.model, packed)
        model._gspo_adapters = found  # type: ignore[assignment]  # nn.Module's attributes: Tensor | Module
    return found


def _named_from_file(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    with safe_open(path, "pt", device="cpu") as fh:
        for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
            yield key, fh.get_tensor(key)


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


class GspoWorkerExtension:
    """Methods mixed into vLLM's worker class; called with ``collective_rpc(name, ...)``."""

    weight_transfer_engine: Any
    model_runner: Any
    vllm_config: Any

    def gspo_model_info(self) -> dict[str, Any]:
        model = self.model_runner.get_model()
        packed = getattr(model, "packed_modules_mapping", {}) or {}
        return {"packed_modules_mapping": {k: list(v) for k, v in packed.items()},
                "pid": os.getpid(), "devices": device_ids(_model_device(model))}

    def gspo_transfer_status(self) -> dict[str, Any]:
        return self.weight_transfer_engine.status()

    def gspo_abandon_update(self) -> None:
        self.weight_transfer_engine.abandon()

    def gspo_leave(self, epoch: int) -> None:
        """Drop group ``epoch`` (only that one: a newer join may have overtaken this call)."""
        if self.weight_transfer_engine.status()["epoch"] == epoch:
            self.weight_transfer_engine.shutdown()

    def gspo_open_ipc(self, request: dict[str, Any]) -> int:
        """Open the CUDA IPC handles of a learner on this worker's GPU
        (``gspo_rl.contract.weights.cuda_ipc``) and keep the tensors for ``gspo_load_ipc``. Separate
        from the load so that a handle that does not open fails before the model is touched."""
        from gspo_rl.contract.weights.cuda_ipc import IpcUpdateRequest, open_tensors

        self._ipc_staged: list[tuple[str, torch.Tensor]] | None = None
        device = _model_device(self.model_runner.get_model())
        req = IpcUpdateRequest.model_validate(request)
        self._ipc_staged = open_tensors(req, device)
        self._ipc_lora = req.lora
        return len(self._ipc_staged)

    def gspo_load_ipc(self) -> int:
        """Load what ``gspo_open_ipc`` opened; the copies have finished on the device when this
        returns (the learner may write its weights again once the server answers)."""
        named, self._ipc_staged = getattr(self, "_ipc_staged", None), None
        if named is None:
            raise RuntimeError("no CUDA IPC weights opened")
        model = self.model_runner.get_model()
        count = load_update(self.vllm_config, model, named, getattr(self, "_ipc_lora", None))
        torch.cuda.synchronize(_model_device(model))
        return count

    def gspo_drop_ipc(self) -> None:
        self._ipc_staged = None

    def gspo_restore_adapter(self) -> int:
        """After a broadcast update: vLLM dropped the adapters, serve ours again."""
        return native_lora.restore(self.model_runner.get_model())

    def gspo_install_adapter(self, adapter_dir: str | None) -> int:
        """Serve a PEFT adapter directory's adapter natively, or the empty one (None)."""
        model = self.model_runner.get_model()
        if adapter_dir is None:
            return native_lora.install(model, None, None)
        from gspo_rl.contract.weights.lora import read_peft_adapter

        _, named, spec = read_peft_adapter(adapter_dir)
        return native_lora.install(model, named, spec)

    def gspo_load_file(self, path: str) -> int:
        """Load a safetensors file of HF-named tensors (the server's ``load_weights``)."""
        return load_update(self.vllm_config, self.model_runner.get_model(),
                           list(_named_from_file(path)), None)


with contextlib.suppress(ValueError):  # registered already (the module was imported twice)
    WeightTransferEngineFactory.register_engine(BACKEND, GspoWeightTransferEngine)
