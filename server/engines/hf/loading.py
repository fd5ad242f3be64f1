"""The hf engine's model and weights (``gspo_rl.server.engines.hf.engine.HFEngine``): the
device it runs on, the model loaded (a PEFT adapter directory as its base with the adapter
merged), and the check a weight update passes before anything is copied. No state of its own:
the engine holds what these return."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from gspo_rl.server.engines.errors import InvalidWeights
from gspo_rl.server.engines.hf import attention as hf_attention

if TYPE_CHECKING:
    from gspo_rl.contract.weights.lora import BaseCopy

log = logging.getLogger(__name__)


def resolve_device(device: str | None) -> torch.device:
    """The engine's device with its CUDA index filled in ("cuda" -> "cuda:<current>"): every
    tensor, generator and transfer buffer of the engine is then made on exactly that GPU."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def load_model(base_path: str, dtype: torch.dtype, device: torch.device,
               adapter: list[Any] | None = None, served_as: str = ""
               ) -> tuple[torch.nn.Module, BaseCopy | None]:
    """The causal LM at ``base_path`` on ``device`` in eval mode, with the engine's attention.
    ``adapter`` ([tensors, LoraSpec], from ``read_peft_adapter``) is merged into it, into a
    kept copy of the base as pushed adapters are; that copy is returned (None without one)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        base_path, dtype=dtype, attn_implementation=hf_attention.register()
    ).to(device).eval()  # type: ignore[arg-type]  # transformers types .to unbound
    if adapter is None:
        return model, None
    from gspo_rl.contract.weights.lora import BaseCopy

    named, spec = adapter
    base = BaseCopy()
    base.merge_into(dict(model.named_parameters()), named, spec)
    log.info("serving %s: base %s with its LoRA adapter (rank %d) merged",
             served_as or base_path, base_path, spec.rank)
    return model, base


def check_weights(params: dict[str, torch.Tensor],
                  items: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Every name of ``items`` is a parameter of the model, with its shape (``KeyError`` /
    ``InvalidWeights`` naming the first that is not)."""
    for name, tensor in items:
        if name not in params:
            raise KeyError(f"unknown parameter {name!r}")
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise InvalidWeights(f"{name}: shape {tuple(tensor.shape)}, expected "
                                 f"{tuple(params[name].shape)}")
