"""``WeightServing`` (gspo_rl.server.rollouts.serving.weights) over a bare ``WeightReceiver``: the
admin weight routes need only the engine's receiving half (no sampling, no model), and they
refuse stale weights, leave a group whose join or broadcast failed, and type every failure
(``InvalidWeights``, ``WeightSyncFailed``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest
import torch

from gspo_rl.contract.weights.collective import JoinRequest, TensorMeta
from gspo_rl.contract.weights.cuda_ipc import IpcUpdateRequest
from gspo_rl.server.engines.base import Engine, SamplingEngine, WeightReceiver
from gspo_rl.server.engines.errors import InvalidWeights, WeightSyncFailed
from gspo_rl.server.engines.updates import WeightUpdates
from gspo_rl.server.rollouts.errors import Problem, RolloutError
from gspo_rl.server.rollouts.protocol import UpdateBody
from gspo_rl.server.rollouts.serving.weights import WeightServing


class Receiver(WeightReceiver):
    """Loads nothing; records what it was asked; fails as told."""

    name = "fake"

    def __init__(self, version: int = 3, fail: BaseException | None = None) -> None:
        self.version, self.fail = version, fail
        self.calls: list[Any] = []

    @property
    def policy_version(self) -> int:
        return self.version

    async def pause(self) -> None:
        self.calls.append("pause")

    async def resume(self) -> None:
        self.calls.append("resume")

    async def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                           version: int) -> None:
        self.version = version

    async def join_weight_group(self, req: JoinRequest) -> None:
        if self.fail is not None:
            raise self.fail

    async def receive_weights(self, req: Any, timeout_s: float) -> None:
        if self.fail is not None:
            raise self.fail
        self.version = req.version

    async def receive_ipc(self, req: IpcUpdateRequest) -> None:
        if self.fail is not None:
            raise self.fail
        self.version = req.version

    def leave_weight_group(self, epoch: int | None = None) -> None:
        self.calls.append(("leave", epoch))


JOIN = JoinRequest(master_addr="127.0.0.1", master_port=29500, rank=1, world_size=2, epoch=7,
                   timeout_s=1.0)
TENSORS = [TensorMeta(name="w", dtype="float32", shape=[1])]


def update(version: int) -> UpdateBody:
    return UpdateBody(epoch=7, version=version, tensors=TENSORS, timeout_s=1.0)


def ipc(version: int) -> IpcUpdateRequest:
    return IpcUpdateRequest.model_construct(version=version, tensors=TENSORS, handles=[],
                                            timeout_s=1.0, lora=None)


def test_the_engine_is_both_halves() -> None:
    assert issubclass(Engine, SamplingEngine) and issubclass(Engine, WeightReceiver)
    assert not issubclass(WeightReceiver, SamplingEngine)


def test_updates_load_and_report_the_version() -> None:
    receiver = Receiver()
    serving = WeightServing(receiver, WeightUpdates())
    assert asyncio.run(serving.update(update(4))).policy_version == 4
    assert asyncio.run(serving.update(update(4))).policy_version == 4  # a retried round
    assert asyncio.run(serving.update_ipc(ipc(5))).policy_version == 5
    assert asyncio.run(serving.pause()).paused is True
    assert asyncio.run(serving.resume()).paused is False
    assert receiver.calls == ["pause", "resume"]


@pytest.mark.parametrize("request_of", [update, ipc])
def test_older_weights_are_refused_as_a_conflict(request_of: Any) -> None:
    serving = WeightServing(Receiver(version=3), WeightUpdates())
    method = serving.update if request_of is update else serving.update_ipc
    with pytest.raises(RolloutError) as caught:
        asyncio.run(method(request_of(2)))
    assert caught.value.problem is Problem.CONFLICT and caught.value.code == "stale_version"


def test_a_failed_join_leaves_that_group() -> None:
    receiver = Receiver(fail=RuntimeError("no route"))
    with pytest.raises(WeightSyncFailed, match="could not join weight group epoch 7: no route"):
        asyncio.run(WeightServing(receiver, WeightUpdates()).join(JOIN))
    assert receiver.calls == [("leave", 7)]


def test_a_failed_broadcast_leaves_the_group_and_is_remembered() -> None:
    receiver, updates = Receiver(fail=TimeoutError()), WeightUpdates()
    with pytest.raises(WeightSyncFailed, match="weight update to version 4 failed"):
        asyncio.run(WeightServing(receiver, updates).update(update(4)))
    assert receiver.calls == [("leave", 7)]
    assert "the weight update to version 4 failed" in updates.describe()


def test_ipc_weights_that_do_not_fit_are_invalid() -> None:
    receiver = Receiver(fail=KeyError("w"))
    with pytest.raises(InvalidWeights, match="bad IPC weight update"):
        asyncio.run(WeightServing(receiver, WeightUpdates()).update_ipc(ipc(4)))
    assert receiver.calls == []  # no group to leave
