"""The admin weight routes below HTTP: join the learner's broadcast group, receive a
broadcast or CUDA IPC update, report the transport, pause and resume.

Every wait is bounded by the request's own timeout (plus 5 s for the collective's own to
fire first); a join or broadcast that fails leaves the group (the learner rebuilds it), and
each failure is typed (``gspo_rl.server.engines.errors``: ``InvalidWeights``, the pusher's
fault; ``WeightSyncFailed``, the transfer's). Weights older than the loaded ones are refused
(a conflict, 409). Updates are tracked (``WeightUpdates``) so that a refusal of admission
can name the update keeping this server behind.
"""

from __future__ import annotations

import asyncio
import logging

from gspo_rl.contract.weights.collective import JoinRequest, TransportInfo
from gspo_rl.contract.weights.cuda_ipc import IpcUpdateRequest
from gspo_rl.server.engines.errors import InvalidWeights, WeightSyncFailed
from gspo_rl.server.engines.receiver import WeightReceiver
from gspo_rl.server.engines.updates import WeightUpdates
from gspo_rl.server.rollouts.errors import conflict
from gspo_rl.server.rollouts.protocol.weights import UpdateBody, VersionResponse

log = logging.getLogger(__name__)
GRACE_S = 5.0
"""Past the request's timeout, the collective's own timeout fires first (its message says
more)."""


class WeightServing:
    """One per app (``app.state.serving_weights``), over the engine's receiving half."""

    def __init__(self, receiver: WeightReceiver, updates: WeightUpdates) -> None:
        self.receiver = receiver
        self.updates = updates

    def version(self, paused: bool = False) -> VersionResponse:
        return VersionResponse(policy_version=self.receiver.policy_version, paused=paused)

    async def join(self, req: JoinRequest) -> VersionResponse:
        """Joins broadcast group ``req.epoch`` (every rank must join, within the timeout)."""
        try:
            await asyncio.wait_for(self.receiver.join_weight_group(req),
                                   timeout=req.timeout_s + GRACE_S)
        except (TimeoutError, RuntimeError) as exc:  # ours, or the collective's own
            self.receiver.leave_weight_group(req.epoch)  # not a newer group joined meanwhile
            why = str(exc) or (f"the group did not form within {req.timeout_s:g} s: every "
                               f"rank must reach {req.master_addr}:{req.master_port} and "
                               "each other")
            raise WeightSyncFailed(
                f"could not join weight group epoch {req.epoch}: {why}") from exc
        return self.version()

    async def update(self, req: UpdateBody) -> VersionResponse:
        """Receives the broadcast tensors, loads them, bumps the policy version."""
        self._refuse_stale(req.version)
        try:
            await self.updates.track(req.version, req.timeout_s, asyncio.wait_for(
                self.receiver.receive_weights(req, req.timeout_s),
                timeout=req.timeout_s + GRACE_S))
        except (TimeoutError, RuntimeError) as exc:  # ours, or the collective's own
            self.receiver.leave_weight_group(req.epoch)  # broken: the learner rebuilds it
            log.warning("weight update %s failed: %s", req.version, exc)
            raise WeightSyncFailed(
                f"weight update to version {req.version} failed: {exc}") from exc
        return self.version()

    async def update_ipc(self, req: IpcUpdateRequest) -> VersionResponse:
        """Loads weights shared as CUDA IPC handles by a learner on this server's GPU."""
        self._refuse_stale(req.version)
        try:
            await self.updates.track(req.version, req.timeout_s, asyncio.wait_for(
                self.receiver.receive_ipc(req), timeout=req.timeout_s))
        except (ValueError, KeyError) as exc:  # names, shapes or plan wrong; not on CUDA
            raise InvalidWeights(f"bad IPC weight update: {exc}") from exc
        except (TimeoutError, RuntimeError) as exc:
            log.warning("IPC weight update %s failed: %s", req.version, exc)
            raise WeightSyncFailed(
                f"weight update to version {req.version} failed: {exc}") from exc
        return self.version()

    async def transport(self) -> TransportInfo:
        """The devices holding the engine's weights (the learner picks its transport)."""
        return await self.receiver.transport_info()

    async def pause(self) -> VersionResponse:
        await self.receiver.pause()
        return self.version(paused=True)

    async def resume(self) -> VersionResponse:
        await self.receiver.resume()
        return self.version()

    def _refuse_stale(self, version: int) -> None:
        """409 for weights older than the loaded ones (equal: a retried round, loading again
        is harmless)."""
        loaded = self.receiver.policy_version
        if version < loaded:
            raise conflict(f"version {version} is older than the loaded {loaded}",
                           code="stale_version")
