"""``gspo export``: a checkpoint as a plain Hugging Face model directory.

A LoRA checkpoint (PEFT adapter, ``gspo_rl.learner.model.lora``) becomes its base model with
the adapter merged in (``W = W0 + alpha/r * B @ A`` for every targeted projection); a full
checkpoint its own weights. The tokenizer files come along (from the base model when the
checkpoint has none). The output loads with ``from_pretrained`` and serves with ``gspo serve
--model``; it never overwrites a non-empty directory.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gspo_rl.learner.checkpoint.store import copy_tokenizer
from gspo_rl.learner.model.lora import base_of, is_adapter_dir, load_base


def export_merged(checkpoint: str | Path, out: str | Path,
                  dtype: torch.dtype = torch.float32) -> Path:
    """Write the merged Hugging Face model of ``checkpoint`` (a LoRA checkpoint: its base
    with ``W = W0 + alpha/r * B @ A``; a full one: its weights) and its tokenizer to ``out``."""
    src, dst = Path(checkpoint), Path(out)
    if not (src / "config.json").is_file() and not is_adapter_dir(src):
        raise ValueError(f"{src} is neither a model nor a LoRA checkpoint directory")
    if dst.exists() and any(dst.iterdir()):
        raise ValueError(f"{dst} exists and is not empty: choose a new directory")
    dst.mkdir(parents=True, exist_ok=True)
    model = load_base(src, dtype)
    model.save_pretrained(dst, safe_serialization=True)  # type: ignore[operator]  # nn.Module's attributes: Tensor | Module
    copied = copy_tokenizer(src, dst)
    if not copied and is_adapter_dir(src):
        copy_tokenizer(Path(base_of(src)), dst)
    return dst
