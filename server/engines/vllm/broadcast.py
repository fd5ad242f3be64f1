"""The vLLM engine's weight updates from the learner: the broadcast and CUDA IPC paths.

- The broadcast: the *worker* takes the rank (``weight_ranks()`` = number of workers), through
  vLLM's weight-transfer API with our ``"gspo"`` backend (``gspo_rl.server.engines.vllm.worker``).
  Receiving runs in a worker thread while generation continues; only when every bucket is in
  does the server pause, load the complete set, bump the version, reset the cache and resume.
  A receive that fails or times out loads nothing: the engine stays on its old weights.
  Chosen over loading bucket by bucket as they arrive (vLLM's NCCL engine), which leaves a
  half-updated model if a sender dies mid-broadcast, and stalls generation while bytes move.
- CUDA IPC: a learner on the worker's own GPU passes CUDA IPC handles instead
  (``gspo_load_ipc``, ``gspo_rl.contract.weights.cuda_ipc``).

``VLLMWeightUpdates`` is a mixin of ``gspo_rl.server.engines.vllm.engine.VLLMEngine``; it relies on
the engine's ``_require``, ``_rpc``, ``_swap`` and ``_check_names`` and its weight lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from gspo_rl.server.engines.errors import InvalidWeights, WeightSyncFailed

if TYPE_CHECKING:
    from gspo_rl.contract.weights.collective import (
        JoinRequest,
        TensorMeta,
        TransportInfo,
        UpdateRequest,
    )
    from gspo_rl.contract.weights.cuda_ipc import IpcUpdateRequest
    from gspo_rl.contract.weights.lora import LoraSpec

POLL_S = 0.02  # how often the server asks the worker whether a join / receive finished


class VLLMWeightUpdates:
    """The broadcast / IPC half of the vLLM engine (see the module docstring)."""

    llm: Any
    _ranks: int
    _devices: list[str]
    _stopping: bool
    _weight_epoch: int | None
    _weights_lock: asyncio.Lock
    _leave_task: asyncio.Task[Any] | None
    _shapes: dict[str, tuple[int, ...]]
    lora_native: bool

    if TYPE_CHECKING:  # provided by VLLMEngine
        def _require(self) -> Any: ...
        async def _rpc(self, method: str, *args: Any) -> list[Any]: ...
        async def _swap(self, load: Callable[[], Awaitable[Any]], version: int) -> None: ...
        def _check_names(self, shapes: list[tuple[str, tuple[int, ...]]]) -> None: ...

    def weight_ranks(self) -> int:
        return self._ranks

    async def transport_info(self) -> TransportInfo:
        from gspo_rl.contract.weights.collective import TransportInfo

        self._require()
        return TransportInfo(devices=list(self._devices))

    async def receive_ipc(self, req: IpcUpdateRequest) -> None:
        """The worker opens the learner's CUDA IPC handles, then pause, reload, resume
        (``gspo_rl.contract.weights.cuda_ipc``). Nothing is loaded unless every handle opened."""
        from gspo_rl.contract.weights.cuda_ipc import check_request

        if not self._devices or any(not d.startswith("GPU-") for d in self._devices):
            raise InvalidWeights(f"CUDA IPC weights need a CUDA engine, this one is on "
                             f"{self._devices}")
        check_request(req)
        self._check_push(req.tensors, req.lora)
        body = req.model_dump()
        async with self._weights_lock:
            try:
                with runtime_errors("opening CUDA IPC handles"):
                    await self._rpc("gspo_open_ipc", body)
                await self._swap(lambda: self._rpc("gspo_load_ipc"), req.version)
            finally:
                with contextlib.suppress(Exception):
                    await self._rpc("gspo_drop_ipc")

    def _check_push(self, metas: list[TensorMeta], lora: LoraSpec | None) -> None:
        """Full weights: their names and shapes; an adapter: its pairs against the base."""
        if lora is None:
            self._check_names([(m.name, tuple(m.shape)) for m in metas])
        else:
            from gspo_rl.server.engines.vllm.adapter import check_adapter

            check_adapter(metas, lora, self._shapes)

    async def join_weight_group(self, req: JoinRequest) -> None:
        """The worker joins group ``req.epoch`` as rank ``req.rank`` (+ its worker index)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self._weight_epoch = None
        init = req.model_dump(include={"backend", "master_addr", "master_port", "rank",
                                       "world_size", "epoch", "timeout_s"})
        with runtime_errors("joining the weight group"):
            await self._require().init_weight_transfer_engine(WeightTransferInitRequest(
                init_info=init))
            await self._wait_worker("joined", "join_error", req.timeout_s, epoch=req.epoch)
        self._weight_epoch = req.epoch

    async def receive_weights(self, req: UpdateRequest, timeout_s: float) -> None:
        """Workers receive every bucket (generation continues), then pause, load, resume."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        if req.epoch != self._weight_epoch:
            raise WeightSyncFailed(f"not a member of broadcast group epoch {req.epoch} "
                               f"(member of {self._weight_epoch})")
        try:
            self._check_push(req.tensors, req.lora)
        except (KeyError, ValueError) as exc:
            raise WeightSyncFailed(f"refusing these weights: {exc}") from exc
        llm = self._require()
        info = {"epoch": req.epoch, "tensors": [m.model_dump() for m in req.tensors],
                "bucket_bytes": req.bucket_bytes, "timeout_s": timeout_s,
                "lora": req.lora.model_dump() if req.lora is not None else None}
        async def load() -> None:  # the complete set; vLLM then drops its adapters
            await llm.finish_weight_update()
            if self.lora_native:
                await self._rpc("gspo_restore_adapter")

        async with self._weights_lock:
            await self._receive_all(llm, WeightTransferUpdateRequest(update_info=info), timeout_s)
            await self._swap(load, req.version)

    async def _receive_all(self, llm: Any, update: Any, timeout_s: float) -> None:
        """Every bucket into the worker's staging area; on any failure, drop what arrived."""
        await llm.start_weight_update()
        try:
            with runtime_errors("receiving weights"):
                await llm.update_weights(update)
                await self._wait_worker("received", "receive_error", timeout_s)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._rpc("gspo_abandon_update")
                await llm.finish_weight_update()  # ends vLLM's update session, loads nothing
            raise

    async def _wait_worker(self, flag: str, error: str, timeout_s: float,
                           epoch: int | None = None) -> None:
        """Poll the worker(s) until ``flag`` is set on all, one reports ``error``, or the
        deadline passes (the EngineCore stays free: the work runs in worker threads)."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = await self._rpc("gspo_transfer_status")
            failed = [s[error] for s in states if s[error]]
            if failed:
                raise WeightSyncFailed(f"weight transfer failed in the vLLM worker: {failed[0]}")
            if all(s[flag] and (epoch is None or s["epoch"] == epoch) for s in states):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM worker not {flag} within {timeout_s}s")
            await asyncio.sleep(POLL_S)

    def leave_weight_group(self, epoch: int | None = None) -> None:
        if epoch is not None and self._weight_epoch not in (None, epoch):
            return  # a newer group was joined since (see Engine.leave_weight_group)
        epoch, self._weight_epoch = self._weight_epoch, None
        if self.llm is not None and not self._stopping and epoch is not None:
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to tell
                self._leave_task = asyncio.get_running_loop().create_task(self._leave(epoch))

    async def _leave(self, epoch: int) -> None:
        with contextlib.suppress(Exception):
            await self._rpc("gspo_leave", epoch)


@contextlib.contextmanager
def runtime_errors(what: str) -> Iterator[None]:
    """vLLM reports a failed utility call as a bare ``Exception``: make it the ``WeightSyncFailed``
    the admin routes answer with a 504 (timeouts and our own errors pass through)."""
    try:
        yield
    except (TimeoutError, RuntimeError, KeyError, ValueError):
        raise
    except Exception as exc:
        raise WeightSyncFailed(f"{what} failed: {exc}") from exc
