"""Run under ``torchrun`` by ``tests/learner/parallel/test_fsdp.py``: the learner with a
``WeightSync`` that writes each pushed weight set to ``OUT/v<version>.safetensors``, exactly the
``(name, tensor)`` list ``BroadcastSync`` would send (``push_payload``: every weight, or a LoRA
learner's adapter tensors, with their ``LoraSpec`` as the file's ``"lora"`` metadata), so the
test can check what a push carries without rollout servers.

    torchrun --nproc-per-node 2 -m tests.helpers.fsdp_probe CONFIG.toml OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.run import run_learner
from gspo_rl.learner.weights.base import NoSyncReport
from gspo_rl.learner.weights.broadcast import push_payload


class DiskSync:
    """A ``WeightSync`` whose "servers" are files."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)

    def push(self, model: torch.nn.Module, version: int) -> NoSyncReport:
        named, spec = push_payload(model)
        tensors = {n: t.detach().cpu().contiguous() for n, t in named}
        meta = {"lora": spec.model_dump_json()} if spec is not None else None
        save_file(tensors, str(self.out / f"v{version}.safetensors"), metadata=meta)
        return NoSyncReport(version=version)

    def close(self) -> None:
        return None


if __name__ == "__main__":
    run_learner(LearnerConfig.from_toml(sys.argv[1]), sync=DiskSync(Path(sys.argv[2])))
