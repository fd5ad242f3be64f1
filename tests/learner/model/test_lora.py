"""LoRA in the learner (gspo_rl.learner.model.lora): a frozen base under PEFT adapters, the
optimizer over the adapters only, checkpoints in PEFT's format that PEFT loads back, resume
that continues exactly, a merged export, and the settings a resume must match."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from gspo_rl.cli.app import app
from gspo_rl.learner.checkpoint.export import export_merged
from gspo_rl.learner.checkpoint.store import LearnerState, SaveDirError, save_checkpoint
from gspo_rl.learner.config import LORA_TARGETS, LearnerConfig
from gspo_rl.learner.model.policy import Policy
from gspo_rl.learner.startup import checkpoint_to_resume
from gspo_rl.learner.trainer import Trainer
from tests.helpers.learner_data import sample_group
from tests.helpers.reference_logprobs import sequence_logprobs

IDS = [5, 17, 42, 99, 7, 300, 12, 8, 64, 3]


def _cfg(tiny_model_dir, **kw) -> LearnerConfig:
    return LearnerConfig(**{"model": str(tiny_model_dir), "lr": 1e-2, "lora_rank": 4,
                            "lora_alpha": 8.0, "minibatches": 2, **kw})


def _lp(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return torch.tensor(sequence_logprobs(model, IDS, 3, 0.8))


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """A LoRA trainer after two steps, its checkpoint, and the groups it trained on."""
    cfg = _cfg(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    trainer = Trainer(Policy.load(tiny_model_dir, "cpu", lora=cfg), cfg)
    groups = [sample_group(base, seed=k) for k in range(3)]
    assert torch.equal(_lp(trainer.policy.model), _lp(base))  # lora_B starts at zero
    trainer.step(groups)
    trainer.step(groups)
    path = save_checkpoint(tmp_path_factory.mktemp("ck"), trainer.policy.peft,
                           trainer.state_dict(), LearnerState(step=2, version=2),
                           tokenizer_src=tiny_model_dir)
    return cfg, base, trainer, groups, path


def test_only_the_adapters_train(trained):
    cfg, base, trainer, _groups, _path = trained
    named = dict(trainer.policy.model.named_parameters())
    trainable = [n for n, p in named.items() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {n.split(".lora_")[0].rsplit(".", 1)[1] for n in trainable} == set(LORA_TARGETS)
    assert len(trainer.optimizer.param_groups[0]["params"]) == len(trainable)
    for name, p in base.named_parameters():  # the frozen base did not move
        key = name.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        mine = named.get(key, named.get(name))
        if mine is not None:
            assert torch.equal(mine, p), name
    assert not torch.allclose(_lp(trainer.policy.model), _lp(base))


def test_checkpoint_is_a_peft_adapter_that_peft_loads(trained, tiny_model_dir):
    _cfg_, _base, trainer, _groups, path = trained
    assert (path / "adapter_config.json").is_file()
    assert (path / "adapter_model.safetensors").is_file()
    assert not (path / "model.safetensors").exists()
    saved = json.loads((path / "adapter_config.json").read_text())
    assert saved["r"] == 4 and saved["lora_alpha"] == 8.0
    fresh = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    loaded = PeftModel.from_pretrained(fresh, str(path))
    torch.testing.assert_close(_lp(loaded), _lp(trainer.policy.model), rtol=0, atol=1e-6)


def test_resume_from_a_lora_checkpoint_continues_exactly(trained):
    cfg, _base, trainer, groups, path = trained
    again = Trainer(Policy.load(path, "cpu", lora=cfg), cfg)
    again.load_state_dict(torch.load(path / "trainer_state.pt", weights_only=True))
    for a, b in zip(trainer.params, again.params, strict=True):
        assert torch.equal(a, b)
    # a copy of the first trainer, so the module fixture stays at step 2
    first = Trainer(Policy.load(path, "cpu", lora=cfg), cfg)
    first.load_state_dict(trainer.state_dict())
    first.step(groups)
    again.step(groups)
    for a, b in zip(first.params, again.params, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_export_writes_the_merged_model(trained, tmp_path):
    _cfg_, _base, trainer, _groups, path = trained
    out = export_merged(path, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(_lp(merged), _lp(trainer.policy.model), rtol=0, atol=1e-5)
    assert (out / "tokenizer.json").is_file()
    res = CliRunner().invoke(app, ["export", "--checkpoint", str(path), "--out", str(out)])
    assert res.exit_code == 2 and "not empty" in res.output  # never over a model
    res = CliRunner().invoke(app, ["export", "--checkpoint", str(path),
                                   "--out", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "cli" / "model.safetensors").is_file()


def test_resume_refuses_other_lora_settings(trained, tiny_model_dir):
    cfg, _base, _trainer, _groups, path = trained
    save_dir = str(path.parent)
    for kw in ({"lora_rank": None}, {"lora_rank": 8}, {"lora_target_modules": "q_proj"}):
        with pytest.raises(SaveDirError):
            checkpoint_to_resume(_cfg(tiny_model_dir, save_dir=save_dir, resume=True, **kw))
    assert checkpoint_to_resume(_cfg(tiny_model_dir, save_dir=save_dir, resume=True)) is not None


def test_settings_parse_and_validate(tiny_model_dir):
    cfg = _cfg(tiny_model_dir, lora_target_modules="q_proj, v_proj")
    assert cfg.lora_target_modules == ["q_proj", "v_proj"]
    assert LearnerConfig(model="m").lora_rank is None  # full fine-tuning by default
    for bad in ({"lora_rank": 0}, {"lora_target_modules": ""}, {"lora_dropout": 1.0}):
        with pytest.raises(ValueError):
            _cfg(tiny_model_dir, **bad)
    # FSDP2 sharding trains adapters too (tests/learner/parallel/test_fsdp.py)
    assert _cfg(tiny_model_dir, data_parallel="fsdp2").data_parallel == "fsdp2"


def test_the_hf_engine_serves_a_lora_checkpoint_and_its_merged_export(trained, tmp_path):
    """`gspo serve --model` of the adapter directory (base + adapter, merged at start into a
    kept copy of the base) and of its merged export: the learner's log-probabilities."""
    import asyncio

    from gspo_rl.server.engines.base import SamplingParams
    from gspo_rl.server.engines.hf.engine import HFEngine

    _cfg_, _base, trainer, _groups, path = trained
    merged = export_merged(path, tmp_path / "merged")

    async def sample(model_dir) -> tuple[list[int], list[float]]:
        engine = HFEngine(str(model_dir), device="cpu")
        await engine.start()
        try:
            out = await engine.generate(IDS[:3], SamplingParams(max_tokens=7, temperature=0.8,
                                                                seed=1))
        finally:
            await engine.shutdown()
        return out.token_ids, out.logprobs

    for model_dir in (path, merged):
        ids, lps = asyncio.run(sample(model_dir))
        with torch.no_grad():
            ours = sequence_logprobs(trainer.policy.model, IDS[:3] + ids, 3, 0.8)
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(ours), atol=1e-4, rtol=0)


def test_packed_varlen_and_checkpointed_passes_give_the_adapters_the_same_gradients(
        tiny_model_dir):
    """With adapters: the packed forward (varlen attention, one sequence at a time on the
    CPU) and gradient checkpointing (frozen embeddings: the inputs must carry grad) give the
    padded pass's log-probs and adapter gradients."""
    from gspo_rl.learner.data.batching import collate, samples_from_groups
    from gspo_rl.learner.model import varlen

    cfg = _cfg(tiny_model_dir)
    policy = Policy.load(tiny_model_dir, "cpu", lora=cfg)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    groups = [sample_group(policy.model, group_size=3, prompt_len=k + 2, seed=k)
              for k in range(3)]
    mb = collate(samples_from_groups(groups))

    def run() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        policy.model.zero_grad(set_to_none=True)
        lp = policy.token_logprobs(mb.tokens_BT, mb.attention_BT, mb.temperature_B, mb.mask_BT)
        (lp * mb.mask_BT).sum().backward()
        return lp.detach(), {n: p.grad.clone() for n, p in policy.model.named_parameters()
                             if p.requires_grad}

    padded, g_padded = run()
    assert len(g_padded) == 28 and all(g.abs().sum() > 0 for g in g_padded.values())
    policy.model.set_attn_implementation(varlen.register())
    policy.packing = True
    packed, g_packed = run()
    policy.packing = False
    policy.model.set_attn_implementation("sdpa")
    policy.model.gradient_checkpointing_enable()
    policy.model.enable_input_require_grads()
    ckpt, g_ckpt = run()
    trained = mb.mask_BT > 0
    for lp, grads in ((packed, g_packed), (ckpt, g_ckpt)):
        torch.testing.assert_close(lp[trained], padded[trained], rtol=2e-6, atol=2e-6)
        for name, g in grads.items():
            assert float((g - g_padded[name]).abs().max()) <= 1e-5 * float(
                g_padded[name].abs().max()), name


def test_the_vllm_engine_serves_an_adapter_directory_as_its_base_with_native_lora(
        trained, tiny_model_dir):
    from gspo_rl.server.engines.vllm.engine import VLLMEngine

    engine = VLLMEngine(str(trained[4]))  # settled before vLLM is imported or anything loads
    assert engine.model_path == str(tiny_model_dir) and engine.lora_native
    assert engine._adapter_dir == str(trained[4])  # installed from memory at start
    kw = engine._engine_kw  # type: ignore[attr-defined]
    assert kw["enable_lora"] and kw["max_lora_rank"] >= trained[0].lora_rank
