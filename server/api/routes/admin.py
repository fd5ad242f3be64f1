"""Control plane of the weight broadcast (admin key): join the group, receive, pause, resume.

The learner drives these; the tensors themselves move over the process group
(contract/weights/collective.py). Every handler is bounded by the request's timeout.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Request
from pydantic import BaseModel

from gspo_rl.contract.weights.collective import JoinRequest, TransportInfo, UpdateRequest
from gspo_rl.contract.weights.cuda_ipc import IpcUpdateRequest
from gspo_rl.server.api.deps import EngineDep
from gspo_rl.server.api.error_docs import error_responses
from gspo_rl.server.api.errors import APIError
from gspo_rl.server.engines.base import Engine
from gspo_rl.server.engines.errors import InvalidWeights, WeightSyncFailed
from gspo_rl.server.engines.updates import WeightUpdates

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin", tags=["admin"])


class VersionResponse(BaseModel):
    policy_version: int
    paused: bool = False


class UpdateBody(UpdateRequest):
    timeout_s: float = 120.0
    """Upper bound for receiving every bucket."""


def _refuse_stale(version: int, engine: Engine) -> None:
    """409 for weights older than the loaded ones (equal: a retried round, loading again is
    harmless)."""
    if version < engine.policy_version:
        raise APIError(409, f"version {version} is older than the loaded "
                       f"{engine.policy_version}", "stale_version")


@router.post("/weights/join", response_model=VersionResponse,
             responses=error_responses(400, 401, 403, 413, 422, 504))
async def join(req: JoinRequest, engine: EngineDep) -> VersionResponse:
    """Join broadcast group ``epoch`` (blocks until every rank has joined, or times out)."""
    try:
        await asyncio.wait_for(engine.join_weight_group(req), timeout=req.timeout_s + 5)
    except (TimeoutError, RuntimeError) as exc:  # ours, or the collective's own
        engine.leave_weight_group(req.epoch)  # not a newer group joined meanwhile
        why = str(exc) or (f"the group did not form within {req.timeout_s:g} s: every rank "
                           f"must reach {req.master_addr}:{req.master_port} and each other")
        raise WeightSyncFailed(f"could not join weight group epoch {req.epoch}: {why}") from exc
    return VersionResponse(policy_version=engine.policy_version)


@router.post("/weights/update", response_model=VersionResponse,
             responses=error_responses(400, 401, 403, 409, 413, 422, 504))
async def update(req: UpdateBody, engine: EngineDep, request: Request) -> VersionResponse:
    """Receive the tensors the learner broadcasts, load them, bump the policy version."""
    _refuse_stale(req.version, engine)
    updates: WeightUpdates = request.app.state.weight_updates
    try:
        await updates.track(req.version, req.timeout_s, asyncio.wait_for(
            engine.receive_weights(req, req.timeout_s), timeout=req.timeout_s + 5))
    except (TimeoutError, RuntimeError) as exc:  # ours, or the collective's own
        engine.leave_weight_group(req.epoch)  # the group is broken: the learner rebuilds it
        log.warning("weight update %s failed: %s", req.version, exc)
        raise WeightSyncFailed(f"weight update to version {req.version} failed: {exc}") from exc
    return VersionResponse(policy_version=engine.policy_version)


@router.get("/weights/transport", response_model=TransportInfo,
            responses=error_responses(401, 403))
async def transport(engine: EngineDep) -> TransportInfo:
    """The devices holding the engine's weights: a learner on the same GPU passes CUDA IPC
    handles (``/admin/weights/update_ipc``) instead of joining a broadcast group."""
    return await engine.transport_info()


@router.post("/weights/update_ipc", response_model=VersionResponse,
             responses=error_responses(400, 401, 403, 409, 413, 422, 504))
async def update_ipc(req: IpcUpdateRequest, engine: EngineDep,
                     request: Request) -> VersionResponse:
    """Load weights shared as CUDA IPC handles by a learner on this server's GPU."""
    _refuse_stale(req.version, engine)
    updates: WeightUpdates = request.app.state.weight_updates
    try:
        await updates.track(req.version, req.timeout_s, asyncio.wait_for(
            engine.receive_ipc(req), timeout=req.timeout_s))
    except (ValueError, KeyError) as exc:  # names, shapes or plan wrong; engine not on CUDA
        raise InvalidWeights(f"bad IPC weight update: {exc}") from exc
    except (TimeoutError, RuntimeError) as exc:
        log.warning("IPC weight update %s failed: %s", req.version, exc)
        raise WeightSyncFailed(f"weight update to version {req.version} failed: {exc}") from exc
    return VersionResponse(policy_version=engine.policy_version)


@router.post("/pause", response_model=VersionResponse,
             responses=error_responses(401, 403))
async def pause(engine: EngineDep) -> VersionResponse:
    await engine.pause()
    return VersionResponse(policy_version=engine.policy_version, paused=True)


@router.post("/resume", response_model=VersionResponse,
             responses=error_responses(401, 403))
async def resume(engine: EngineDep) -> VersionResponse:
    await engine.resume()
    return VersionResponse(policy_version=engine.policy_version)
