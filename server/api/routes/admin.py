"""Control plane of the weight broadcast (admin key): join the group, receive, pause, resume.

The learner drives these; the tensors themselves move over the process group
(contract/weights/collective.py). Every handler is bounded by the request's timeout; the work
is ``WeightServing``'s (``gspo_rl.server.rollouts.serving.weights``).
"""

from __future__ import annotations

from fastapi import APIRouter

from gspo_rl.contract.weights.collective import JoinRequest, TransportInfo
from gspo_rl.contract.weights.cuda_ipc import IpcUpdateRequest
from gspo_rl.server.api.deps import WeightsDep
from gspo_rl.server.api.error_docs import error_responses
from gspo_rl.server.rollouts.protocol.weights import UpdateBody, VersionResponse

router = APIRouter(prefix="/admin", tags=["admin"])


@router.post("/weights/join", response_model=VersionResponse,
             responses=error_responses(400, 401, 403, 413, 422, 504))
async def join(req: JoinRequest, weights: WeightsDep) -> VersionResponse:
    """Join broadcast group ``epoch`` (blocks until every rank has joined, or times out)."""
    return await weights.join(req)


@router.post("/weights/update", response_model=VersionResponse,
             responses=error_responses(400, 401, 403, 409, 413, 422, 504))
async def update(req: UpdateBody, weights: WeightsDep) -> VersionResponse:
    """Receive the tensors the learner broadcasts, load them, bump the policy version."""
    return await weights.update(req)


@router.get("/weights/transport", response_model=TransportInfo,
            responses=error_responses(401, 403))
async def transport(weights: WeightsDep) -> TransportInfo:
    """The devices holding the engine's weights: a learner on the same GPU passes CUDA IPC
    handles (``/admin/weights/update_ipc``) instead of joining a broadcast group."""
    return await weights.transport()


@router.post("/weights/update_ipc", response_model=VersionResponse,
             responses=error_responses(400, 401, 403, 409, 413, 422, 504))
async def update_ipc(req: IpcUpdateRequest, weights: WeightsDep) -> VersionResponse:
    """Load weights shared as CUDA IPC handles by a learner on this server's GPU."""
    return await weights.update_ipc(req)


@router.post("/pause", response_model=VersionResponse,
             responses=error_responses(401, 403))
async def pause(weights: WeightsDep) -> VersionResponse:
    return await weights.pause()


@router.post("/resume", response_model=VersionResponse,
             responses=error_responses(401, 403))
async def resume(weights: WeightsDep) -> VersionResponse:
    return await weights.resume()
