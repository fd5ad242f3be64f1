"""Which SDPA backends masked attention runs with on CUDA: the hf engine's steps and the
learner's padded forwards both use ``masked_sdpa_backends``.

Both have a padding mask and a new shape nearly every time (the engine's cache grows by a
column each step and rows join and leave; the learner's padded microbatches change length).
PyTorch 2.11 picks cuDNN attention for masked bfloat16 SDPA on an H100, and cuDNN builds an
execution graph, on the CPU, for every shape it has not seen (measured:
docs/design/learner-model.md). So on CUDA every backend but cuDNN attention stays allowed;
the flags are PyTorch's process-wide ones, restored when the context exits.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

_NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def masked_sdpa_backends(device: torch.device) -> AbstractContextManager[Any]:
    """All SDPA backends but cuDNN attention on CUDA; on other devices, PyTorch's choice."""
    return sdpa_kernel(_NO_CUDNN) if device.type == "cuda" else nullcontext()
