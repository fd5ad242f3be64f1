"""LoRA adapters on the wire: what a push of adapters carries, and how a server applies it.

A learner training LoRA (``--lora-rank``) pushes only the adapter tensors, over the same
transports as full weights (gloo, NCCL, CUDA IPC; same ``TensorMeta`` lists and buckets), and
a ``LoraSpec`` beside them in the update request. Names are the base model's Hugging Face
checkpoint names of each wrapped projection plus ``.lora_A.weight`` (``[r, in]``) or
``.lora_B.weight`` (``[out, r]``): ``model.layers.0.self_attn.q_proj.lora_A.weight`` adapts
``model.layers.0.self_attn.q_proj.weight``.

A server applies an adapter by merging it into its own copy of the base: ``BaseCopy`` keeps
``W0`` of every weight an adapter has touched (taken from the engine's weights the first
time), and each push loads ``W = W0 + (alpha / r) * B @ A`` (computed in float32, then cast to
the engine's dtype; ``merge_into`` writes it in place), so adapters never accumulate
rounding: version v is always ``W0`` plus v's adapter. A full push replaces the base
(``BaseCopy.forget``). ``read_peft_adapter`` reads a PEFT adapter directory (a learner's LoRA
checkpoint) as such a push, for a server started on a base plus an adapter. Design:
docs/lora.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from pydantic import BaseModel, Field

_A, _B = ".lora_A.weight", ".lora_B.weight"


class LoraSpec(BaseModel):
    """The adapter's settings a server needs to apply it (PEFT's ``r`` and ``lora_alpha``)."""

    rank: int = Field(ge=1, le=65536)
    alpha: float = Field(gt=0)
    target_modules: list[str] = Field(min_length=1)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def adapter_pairs(named: Iterable[tuple[str, torch.Tensor]], spec: LoraSpec
                  ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{base weight name: (A, B)}`` of an adapter push. ValueError for a name that is no
    adapter tensor, an A without its B (or the reverse), or shapes that are not ``[r, in]``
    and ``[out, r]``."""
    a_of: dict[str, torch.Tensor] = {}
    b_of: dict[str, torch.Tensor] = {}
    for name, t in named:
        if name.endswith(_A):
            a_of[name[: -len(_A)] + ".weight"] = t
        elif name.endswith(_B):
            b_of[name[: -len(_B)] + ".weight"] = t
        else:
            raise ValueError(f"{name!r} is not a LoRA tensor (*{_A} or *{_B})")
    if a_of.keys() != b_of.keys():
        odd = sorted(a_of.keys() ^ b_of.keys())
        raise ValueError(f"LoRA tensors without their pair: {odd[:3]}")
    for name, a in a_of.items():
        b = b_of[name]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != spec.rank or b.shape[1] != spec.rank:
            raise ValueError(f"{name}: A {tuple(a.shape)} and B {tuple(b.shape)} are not "
                             f"[r, in] and [out, r] with r = {spec.rank}")
    return {n: (a_of[n], b_of[n]) for n in a_of}


def merged_weight(w0: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """``W0 + scale * B @ A`` in float32, cast to ``W0``'s dtype, on ``W0``'s device."""
    a32, b32 = a.to(w0.device, torch.float32), b.to(w0.device, torch.float32)
    return torch.addmm(w0.to(torch.float32), b32, a32, alpha=scale).to(w0.dtype)


def merge_weight_into(out: torch.Tensor, w0: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                      scale: float) -> None:
    """``out = W0 + scale * B @ A`` (``merged_weight``) written into ``out``: a float32
    ``out`` takes it straight from one ``addmm``, with no temporary the size of ``W``."""
    a32, b32 = a.to(out.device, torch.float32), b.to(out.device, torch.float32)
    if out.dtype == torch.float32:
        torch.addmm(w0, b32, a32, alpha=scale, out=out)
    else:  # summed in float32, cast by the copy
        out.copy_(torch.addmm(w0.to(torch.float32), b32, a32, alpha=scale))


class BaseCopy:
    """A server's copy of the base weights that adapters are merged into (see the module
    docstring). ``merge`` checks every name and shape before it keeps anything."""

    def __init__(self) -> None:
        self.w0: dict[str, torch.Tensor] = {}

    def merge(self, params: Mapping[str, torch.Tensor],
              named: Iterable[tuple[str, torch.Tensor]], spec: LoraSpec
              ) -> list[tuple[str, torch.Tensor]]:
        """The weights to load for an adapter push, by base weight name: each adapted one
        merged, and ``W0`` back in any an earlier adapter touched and this one does not.
        ``params``: the engine's current weights (read once per name: the first adapter's
        base)."""
        pairs = self._take(params, named, spec)
        out = [(n, merged_weight(self.w0[n], a, b, spec.scale)) for n, (a, b) in pairs.items()]
        return out + [(n, w) for n, w in self.w0.items() if n not in pairs]

    @torch.no_grad()
    def merge_into(self, params: Mapping[str, torch.Tensor],
                   named: Iterable[tuple[str, torch.Tensor]], spec: LoraSpec) -> None:
        """``merge``, written into ``params`` in place (``merge_weight_into``): the adapted
        weights merged, the ones only an earlier adapter touched back to ``W0``. Nothing is
        written unless every name and shape checks."""
        pairs = self._take(params, named, spec)
        for name, w0 in self.w0.items():
            if name in pairs:
                merge_weight_into(params[name], w0, *pairs[name], spec.scale)
            else:
                params[name].copy_(w0)

    def _take(self, params: Mapping[str, torch.Tensor],
              named: Iterable[tuple[str, torch.Tensor]], spec: LoraSpec
              ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The push's ``{name: (A, B)}``, checked against ``params``; ``W0`` kept for each
        name seen for the first time."""
        pairs = adapter_pairs(named, spec)
        for name, (a, b) in pairs.items():
            if name not in params:
                raise KeyError(f"the adapter targets {name!r}, which this model does not have")
            w = params[name]
            if (b.shape[0], a.shape[1]) != tuple(w.shape):
                raise ValueError(f"{name}: B @ A is {(b.shape[0], a.shape[1])}, the weight "
                                 f"{tuple(w.shape)}")
        for name in pairs:
            if name not in self.w0:
                self.w0[name] = params[name].detach().clone()
        return pairs

    def forget(self) -> None:
        """A full push replaced the base: adapters from now on apply to it."""
        self.w0.clear()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.w0.values())


PEFT_PREFIX = "base_model.model."


def read_peft_adapter(path: str | Path) -> tuple[str, list[tuple[str, torch.Tensor]], LoraSpec]:
    """(base model, adapter tensors in wire names, spec) of a PEFT LoRA directory
    (``adapter_config.json`` and ``adapter_model.safetensors``). ValueError for what a server
    cannot apply: another PEFT method, per-layer ranks or alphas, DoRA, rsLoRA, biases."""
    from safetensors.torch import load_file

    root = Path(path)
    cfg = json.loads((root / "adapter_config.json").read_text())
    unsupported = [k for k in ("rank_pattern", "alpha_pattern", "use_dora", "use_rslora",
                               "modules_to_save") if cfg.get(k)]
    if cfg.get("peft_type", "LORA") != "LORA" or unsupported or cfg.get("bias", "none") != "none":
        raise ValueError(f"{root}: only plain LoRA adapters can be served (found "
                         f"{cfg.get('peft_type')}, {unsupported or cfg.get('bias')})")
    targets = cfg.get("target_modules") or []
    spec = LoraSpec(rank=int(cfg["r"]), alpha=float(cfg["lora_alpha"]),
                    target_modules=[targets] if isinstance(targets, str) else list(targets))
    tensors = load_file(str(root / "adapter_model.safetensors"))
    named = [(n.removeprefix(PEFT_PREFIX), t) for n, t in tensors.items()]
    return str(cfg["base_model_name_or_path"]), named, spec
