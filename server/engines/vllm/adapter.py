"""LoRA adapter pushes on the vLLM engine: merged into the base inside the worker.

The adapter tensors travel to the worker exactly as full weights do (broadcast buckets or CUDA
IPC handles, ``gspo_rl.contract.weights.lora`` names). The worker merges them into ``W0``
(``BaseCopy``), which it reads from the served model's own safetensors files
(``DiskWeights``: Hugging Face names, so tensor-parallel sharding and vLLM's fused
``qkv_proj`` / ``gate_up_proj`` stay vLLM's business), and reloads the merged projections in
place, together with the unchanged ``W0`` of any fused sibling the adapter does not target.
``W0`` is kept in host memory for the targeted weights. This is not vLLM's own LoRA serving
(punica kernels, the adapter applied in the forward): docs/lora.md says why and what it costs.
A full push after adapters does not change ``W0`` here (the file's weights stay the base).

``check_adapter`` is the server-side check of names and shapes before anything is received.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from gspo_rl.contract.weights.collective import TensorMeta
from gspo_rl.contract.weights.lora import BaseCopy, LoraSpec, adapter_pairs
from gspo_rl.server.engines.errors import InvalidWeights
from gspo_rl.server.engines.vllm.convert import fused_siblings


def check_adapter(metas: list[TensorMeta], spec: LoraSpec,
                  shapes: Mapping[str, tuple[int, ...]]) -> None:
    """KeyError / ValueError unless every tensor pairs up and targets a weight of this model
    with the shape ``B @ A`` has."""
    empty = [(m.name, torch.empty(m.shape, device="meta")) for m in metas]
    for name, (a, b) in adapter_pairs(empty, spec).items():
        if name not in shapes:
            raise KeyError(f"the adapter targets {name!r}, which this model does not have")
        if (b.shape[0], a.shape[1]) != tuple(shapes[name]):
            raise InvalidWeights(f"{name}: B @ A is {(b.shape[0], a.shape[1])}, the weight "
                             f"{tuple(shapes[name])}")


class DiskWeights(Mapping[str, torch.Tensor]):
    """The model directory's safetensors tensors by name, read on demand (CPU)."""

    def __init__(self, model_dir: str) -> None:
        self.dir = model_dir
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index) as f:
                self.files: dict[str, str] = json.load(f)["weight_map"]
        else:
            from safetensors import safe_open

            single = "model.safetensors"
            with safe_open(os.path.join(model_dir, single), "pt") as fh:
                self.files = {k: single for k in fh.keys()}  # noqa: SIM118

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(os.path.join(self.dir, self.files[name]), "pt", device="cpu") as fh:
            return fh.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


class WorkerAdapters:
    """One worker's ``W0`` and merge (see the module docstring)."""

    def __init__(self, model_dir: str, packed: dict[str, list[str]]) -> None:
        self.disk = DiskWeights(model_dir)
        self.packed = packed
        self.base = BaseCopy()

    def merged(self, named: list[tuple[str, torch.Tensor]], spec: dict[str, Any] | LoraSpec
               ) -> list[tuple[str, torch.Tensor]]:
        """The HF-named weights to reload for an adapter push."""
        lora = spec if isinstance(spec, LoraSpec) else LoraSpec.model_validate(spec)
        out = self.base.merge(self.disk, [(n, t.cpu()) for n, t in named], lora)
        have = {n for n, _ in out}
        extra = {s for n in have for s in fused_siblings(n, self.packed) if s not in have}
        return out + [(n, self.base.w0.setdefault(n, self.disk[n])) for n in sorted(extra)]
