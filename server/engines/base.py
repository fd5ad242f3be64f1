"""The engine interface: what the rollout server needs from an inference engine.

One engine fronts one model. Requests are token ids in, token ids + log-probabilities out; the
server does all tokenisation and chat templating, so both engines see exactly the same tokens.

Log-probabilities are those of the distribution actually sampled from: after temperature
(``log_softmax(logits / temperature)``) and, when top-k / top-p are on, after truncation and
renormalisation, with vLLM's rule for the kept set (``gspo_rl.contract.sampling_dist.keep_mask``);
both engines say so in ``Engine.logprobs_after_truncation``. The rollout record stores the
temperature, top_p and top_k, and the learner computes its log-probabilities under the same
truncated distribution.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

from gspo_rl.server.engines.errors import RequestRefused, WeightSyncFailed

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

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one completion (one sample: the server fans out ``n``)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    stop: tuple[str, ...] = ()  # stop strings, matched on the decoded completion
    stop_token_ids: tuple[int, ...] = ()  # e.g. EOS / end-of-turn; the token is kept
    seed: int | None = None
    top_logprobs: int = 0  # also return the k most likely tokens at each step


@dataclass
class Completion:
    """One sampled completion. All lists have one entry per generated token."""

    token_ids: list[int]
    logprobs: list[float]  # log p(token) under the sampled distribution (after temperature)
    policy_versions: list[int]  # the engine's policy version when each token was sampled
    finish_reason: FinishReason
    top_logprobs: list[list[tuple[int, float]]] | None = None
    stop_string: str | None = None  # the stop string that ended it, if any


@dataclass
class Partial:
    """A completion still being generated (``Engine.generate_stream``): its first ``length``
    tokens. The lists may be shared with the engine and grow past ``length``; read them up to
    ``length`` only."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None
    length: int


@dataclass
class EngineStats:
    """Point-in-time engine numbers for /metrics and /health."""

    running: int = 0  # requests being decoded
    waiting: int = 0  # requests queued
    extra: dict[str, float] = field(default_factory=dict)


class Engine(abc.ABC):
    """An inference engine. All methods are called from the server's event loop."""

    name: str
    model_path: str
    max_model_len: int
    device: torch.device = torch.device("cpu")  # where the weights live (hf: its device)

    @property
    @abc.abstractmethod
    def policy_version(self) -> int:
        """Version of the weights currently loaded (0 = the weights it started with)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model; return when ready to generate."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Release everything; abort requests in flight."""

    @abc.abstractmethod
    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Completion:
        """Sample one completion. Concurrent calls must be batched together by the engine."""

    async def generate_stream(self, prompt_token_ids: list[int], params: SamplingParams
                              ) -> AsyncGenerator[Partial | Completion, None]:
        """``generate``, reporting progress: a ``Partial`` each time the completion grows, then
        the finished ``Completion`` last. Closing the iterator (or cancelling its consumer)
        aborts the request, as cancelling ``generate`` does. Default: the completion alone
        (an engine that cannot report progress streams nothing before the end)."""
        yield await self.generate(prompt_token_ids, params)

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

    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """Current load, for metrics."""

    def dead_reason(self) -> str | None:
        """Why this engine can never generate again (its scheduler or worker died), or None
        while it can. Cheap: polled by the server's watchdog (``gspo_rl.server.run``),
        which then reports the server unhealthy and ends the process so that it is restarted."""
        return None

    # ------------------------------------------------------------------ weight broadcast
    # Default: this server process itself takes one rank of the learner's broadcast group,
    # receives every bucket, then loads. Engines whose weights live in other processes (vLLM
    # workers) override both methods so that their workers take the ranks.

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

    async def load_adapter(self, tensors: list[tuple[str, torch.Tensor]], lora: LoraSpec,
                           version: int) -> None:
        """Apply LoRA adapter tensors (``gspo_rl.contract.weights.lora``) to this engine's
        base weights, then set the policy version. Callers pause first; KeyError or
        ValueError (the push is refused) before anything changes."""
        raise NotImplementedError(f"the {self.name} engine cannot apply LoRA adapters")

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


def validate_request(prompt: list[int], p: SamplingParams, vocab_size: int,
                     max_model_len: int) -> None:
    """Every engine's checks of a request, with one set of messages (``RequestRefused``: the
    server answers 400): a non-empty prompt of in-vocabulary ids that leaves room for one new token,
    at least one new token, sampling parameters in range."""
    if not prompt:
        raise RequestRefused("prompt_token_ids must not be empty")
    if any(not 0 <= int(t) < vocab_size for t in prompt):
        raise RequestRefused(f"prompt token ids must lie in [0, {vocab_size})")
    if len(prompt) >= max_model_len:
        raise RequestRefused(f"prompt has {len(prompt)} tokens; max_model_len is "
                         f"{max_model_len} (prompt + at least one new token)")
    if p.max_tokens < 1:
        raise RequestRefused("max_tokens must be >= 1")
    if p.temperature < 0 or not 0 < p.top_p <= 1 or p.top_k < 0 or p.top_logprobs < 0:
        raise RequestRefused("need temperature >= 0, 0 < top_p <= 1, top_k >= 0, "
                         "top_logprobs >= 0")
