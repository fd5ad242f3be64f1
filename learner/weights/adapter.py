"""What a push of a LoRA-trained policy sends: the adapter tensors and their ``LoraSpec``.

``lora_payload`` finds PEFT's LoRA layers in the learner's model by their attributes (a
``lora_A`` / ``lora_B`` ``ModuleDict`` and the ``r`` / ``lora_alpha`` dicts of one adapter),
so this package needs no PEFT import, and names each tensor the way the wire contract does
(``gspo_rl.contract.weights.lora``): the wrapped projection's Hugging Face name plus
``.lora_A.weight`` or ``.lora_B.weight``. A model without LoRA layers gives ``None`` (a full
push). One adapter, one rank and one alpha for every layer: anything else is refused.
"""

from __future__ import annotations

import torch
from torch import nn

from gspo_rl.contract.weights.lora import LoraSpec


def lora_payload(model: nn.Module) -> tuple[list[tuple[str, torch.Tensor]], LoraSpec] | None:
    """``(adapter tensors, spec)`` of ``model``'s LoRA layers, or ``None`` without any."""
    named: list[tuple[str, torch.Tensor]] = []
    settings: set[tuple[int, float]] = set()
    targets: set[str] = set()
    for name, m in model.named_modules():
        a, b = getattr(m, "lora_A", None), getattr(m, "lora_B", None)
        if not isinstance(a, nn.ModuleDict) or not isinstance(b, nn.ModuleDict) or not len(a):
            continue
        if len(a) != 1:
            raise ValueError(f"{name}: {len(a)} adapters; the push sends exactly one")
        key = next(iter(a.keys()))
        settings.add((int(m.r[key]), float(m.lora_alpha[key])))
        targets.add(name.rsplit(".", 1)[-1])
        named.append((f"{name}.lora_A.weight", a[key].weight.detach()))  # type: ignore[operator]  # nn.Module's attributes: Tensor | Module
        named.append((f"{name}.lora_B.weight", b[key].weight.detach()))  # type: ignore[operator]  # nn.Module's attributes: Tensor | Module
    if not named:
        return None
    if len(settings) != 1:
        raise ValueError(f"LoRA layers with different (rank, alpha): {sorted(settings)}")
    (rank, alpha), = settings
    return named, LoraSpec(rank=rank, alpha=alpha, target_modules=sorted(targets))
