"""The weight half of the engine interface: what the admin routes drive (through
``gspo_rl.server.rollouts.serving.weights``) to load the learner's new weights.

A receiver pauses and resumes its generation, loads named tensors (full weights or a LoRA
adapter) and bumps its ``policy_version``. Weights arrive over the learner's broadcast group
(``join_weight_group``, ``receive_weights``, ``leave_weight_group``:
``gspo_rl.contract.weights.collective``) or as CUDA IPC handles on the same GPU
(``receive_ipc``: ``gspo_rl.contract.weights.cuda_ipc``). Either way every tensor is received
first, then the engine pauses, loads and resumes: a transfer that fails half-way leaves the
engine on its old weights, never on a mix.

The defaults here take one rank in this server's process; engines whose weights live in other
processes (vLLM workers) override the transfer methods so that their workers take the ranks.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from gspo_rl.server.engines.errors import WeightSyncFailed

if TYPE_CHECKING:
    import torch.distributed as dist

    from gspo_rl.contract.weights.collective import (
        Backend,
        JoinRequest,
        TransportInfo,
        UpdateRequest,
    )
    from gspo_rl.contract.weights.cuda_ipc import IpcUpdateRequest
    from gspo_rl.contract.weights.lora import LoraSpec


class WeightReceiver(abc.ABC):
    """Loads pushed weights into a serving engine. All methods are called from the server's
    event loop."""

    name: str
    device: torch.device = torch.device("cpu")  # where the weights live (hf: its device)

    @property
    @abc.abstractmethod
    def policy_version(self) -> int:
        """Version of the weights currently loaded (0 = the weights it started with)."""

    @abc.abstractmethod
    async def pause(self) -> None:
        """Stop scheduling new decode steps; requests in flight wait (not aborted)."""

    @abc.abstractmethod
    async def resume(self) -> None:
        """Undo ``pause``."""

    @abc.abstractmethod
    async def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Load (a subset of) named parameters in Hugging Face checkpoint names, then set the
        policy version. Callers pause first; tokens sampled after this carry ``version``.
        They are the new base that later adapters (``load_adapter``) apply to."""

    async def load_adapter(self, tensors: list[tuple[str, torch.Tensor]], lora: LoraSpec,
                           version: int) -> None:
        """Apply LoRA adapter tensors (``gspo_rl.contract.weights.lora``) to this engine's
        base weights, then set the policy version. Callers pause first; KeyError or
        ValueError (the push is refused) before anything changes."""
        raise NotImplementedError(f"the {self.name} engine cannot apply LoRA adapters")

    # ------------------------------------------------------------------ weight broadcast
    _weight_pg: dist.ProcessGroup | None = None
    _weight_epoch: int | None = None
    _weight_backend: Backend = "gloo"

    def weight_ranks(self) -> int:
        """How many ranks of the broadcast group this engine takes."""
        return 1

    async def transport_info(self) -> TransportInfo:
        """The physical devices holding the weights; the learner picks the transport by it."""
        from gspo_rl.contract.weights.collective import TransportInfo, device_ids

        return TransportInfo(devices=device_ids(self.device))

    async def join_weight_group(self, req: JoinRequest) -> None:
        from gspo_rl.contract.weights.collective import make_process_group

        self._weight_pg = None
        self._weight_pg = await asyncio.to_thread(
            make_process_group, req.backend, req.master_addr, req.master_port, req.rank,
            req.world_size, req.epoch, req.timeout_s)
        self._weight_epoch, self._weight_backend = req.epoch, req.backend

    async def receive_weights(self, req: UpdateRequest, timeout_s: float) -> None:
        """Receive every tensor first, then pause, load and resume: a broadcast that fails
        half-way leaves the engine on its old weights, never on a mix."""
        from gspo_rl.contract.weights.collective import receive_tensors, transport_device

        if self._weight_pg is None or req.epoch != self._weight_epoch:
            raise WeightSyncFailed(f"not a member of broadcast group epoch {req.epoch} "
                               f"(member of {self._weight_epoch})")
        pg = self._weight_pg
        # NCCL: buckets land straight in the engine's GPU memory; gloo: in host memory.
        device = transport_device(self._weight_backend, self.device)
        tensors = await asyncio.to_thread(
            lambda: list(receive_tensors(pg, req.tensors, req.bucket_bytes, timeout_s, device)))
        await self.pause()
        try:
            await self._load_pushed(tensors, req.version, req.lora)
        finally:
            await self.resume()

    async def _load_pushed(self, tensors: list[tuple[str, torch.Tensor]], version: int,
                           lora: LoraSpec | None) -> None:
        if lora is None:
            await self.load_weights(tensors, version)
            return
        try:
            await self.load_adapter(tensors, lora, version)
        except (KeyError, ValueError) as exc:
            raise WeightSyncFailed(f"refusing this adapter: {exc}") from exc

    async def receive_ipc(self, req: IpcUpdateRequest) -> None:
        """Load weights the learner shares on this engine's GPU
        (``gspo_rl.contract.weights.cuda_ipc``). Every copy has finished on the device before this
        returns: once answered, the learner trains (writes those tensors) again."""
        from gspo_rl.contract.weights.cuda_ipc import open_tensors

        tensors = await asyncio.to_thread(open_tensors, req, self.device)
        await self.pause()
        try:
            await self._load_pushed(tensors, req.version, req.lora)
            await asyncio.to_thread(torch.cuda.synchronize, self.device)
        finally:
            await self.resume()

    def leave_weight_group(self, epoch: int | None = None) -> None:
        """Leave the broadcast group; given ``epoch``, only if no newer group was joined
        since (a join the learner abandoned can fail after the next one succeeded)."""
        if epoch is not None and self._weight_epoch not in (None, epoch):
            return
        self._weight_pg = None
        self._weight_epoch = None
