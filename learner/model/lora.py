"""LoRA adapters on the learner's policy, through PEFT.

``apply_lora`` injects fresh adapters (``lora_B`` starts at zero: the policy is unchanged
until the first update) or loads a saved one, trainable, into a loaded Hugging Face model, in
place: the ``Policy`` keeps the Hugging Face model (the fused head and packed forwards see the
same module tree, its projections now PEFT ``lora.Linear`` layers) and the ``PeftModel``
beside it, which writes checkpoints in PEFT's format (``adapter_config.json`` and
``adapter_model.safetensors``: loadable by ``PeftModel.from_pretrained`` and by vLLM). Base
weights are frozen (``requires_grad`` False), so the trainer's optimizer holds the adapters
only. ``base_of`` reads where an adapter directory's base model is; ``load_base`` loads a
model directory, or an adapter directory merged into its base (``gspo export``);
``load_model`` is the one loader of the learner's model with its adapters, shared by the
single-process, replicated and FSDP2-sharded policies and by FSDP2's host copy, so that they
all hold the same base and the same adapters.

Settings are duck-typed (``lora_rank``, ``lora_alpha``, ``lora_dropout``,
``lora_target_modules``: ``LearnerConfig``'s fields). Why PEFT, and the memory arithmetic:
docs/lora.md.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)
ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_dir(path: str | Path) -> bool:
    """Whether ``path`` is a PEFT adapter directory (a LoRA checkpoint)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_settings(path: str | Path) -> dict[str, Any]:
    """The saved ``adapter_config.json`` of an adapter directory."""
    return json.loads((Path(path) / ADAPTER_CONFIG).read_text())


def base_of(path: str | Path) -> str:
    """The base model an adapter directory was trained on (its ``base_model_name_or_path``)."""
    base = adapter_settings(path).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{path}/{ADAPTER_CONFIG} names no base model "
                         "(base_model_name_or_path)")
    return str(base)


def _peft_config(settings: Any) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=int(settings.lora_rank), lora_alpha=float(settings.lora_alpha),  # type: ignore[arg-type]  # peft types it int; a float works (alpha / r)
                      lora_dropout=float(settings.lora_dropout),
                      target_modules=list(settings.lora_target_modules), bias="none",
                      task_type="CAUSAL_LM")


def check_matches(path: str | Path, settings: Any) -> None:
    """A saved adapter must have the rank, alpha and targets asked for (ValueError)."""
    saved = adapter_settings(path)
    want = {"r": int(settings.lora_rank), "lora_alpha": float(settings.lora_alpha),
            "target_modules": sorted(settings.lora_target_modules)}
    have = {"r": saved.get("r"), "lora_alpha": float(saved.get("lora_alpha", 0)),
            "target_modules": sorted(saved.get("target_modules") or [])}
    if want != have:
        raise ValueError(f"the adapter in {path} has {have}, but this run asks for {want}: "
                         "pass the same --lora-* settings, or start a new --save-dir")


def apply_lora(model: nn.Module, settings: Any, adapter: str | Path | None = None) -> Any:
    """Wrap ``model`` (in place) with trainable LoRA adapters: fresh ones, or those saved in
    ``adapter``. Returns the ``PeftModel``; logs trainable vs total parameters."""
    from peft import PeftModel, get_peft_model

    if adapter is not None:
        check_matches(adapter, settings)
        peft_model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    else:
        peft_model = get_peft_model(model, _peft_config(settings))
    trainable, total = count_params(model)
    log.info("LoRA rank %d alpha %g on %s: trainable %s / total %s params (%.3f%%)",
             settings.lora_rank, settings.lora_alpha, ",".join(settings.lora_target_modules),
             f"{trainable:,}", f"{total:,}", 100.0 * trainable / max(total, 1))
    return peft_model


def count_params(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts (tied tensors once)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def base_source(path: str | Path) -> str:
    """Where the base model of ``path`` loads from: an adapter directory's base, else
    ``path``, absolute when it is local (a LoRA checkpoint records it as its base,
    ``base_model_name_or_path``)."""
    if is_adapter_dir(path):
        return base_of(path)
    local = Path(path)
    return str(local.resolve()) if local.exists() else str(path)


def load_base(path: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The Hugging Face model at ``path``; an adapter directory loads its base with the
    adapter merged in (a LoRA checkpoint as the start of full fine-tuning, or to serve)."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_source(path), dtype=dtype)
    if not is_adapter_dir(path):
        return base
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(path)).merge_and_unload()


def load_model(path: str | Path, settings: Any = None) -> tuple[nn.Module, Any]:
    """``(model, peft)``: the float32 Hugging Face model of ``path`` on the CPU, and with
    ``settings.lora_rank`` set its ``PeftModel`` (adapters injected in place: those of ``path``
    when it is an adapter directory, else fresh ones, drawn from torch's global RNG); ``peft``
    is ``None`` without LoRA (an adapter directory then loads merged into its base)."""
    lora = settings is not None and getattr(settings, "lora_rank", None) is not None
    if lora and is_adapter_dir(path):
        model = load_base(base_of(path))
        return model, apply_lora(model, settings, adapter=path)
    model = load_base(path)
    return model, apply_lora(model, settings) if lora else None
