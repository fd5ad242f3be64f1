"""gspo_rl.learner.model.speed and gspo_rl.learner.model.precision: the GPU levers are chosen by
device and size, and bf16 parameters train through float32 master weights (checked on the CPU)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config

from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.model import varlen
from gspo_rl.learner.model.policy import Policy
from gspo_rl.learner.model.precision import MasterWeights
from gspo_rl.learner.model.speed import needs_checkpointing, plan_speed
from gspo_rl.learner.trainer import Trainer
from tests.helpers.learner_data import sample_group

GIB = 2**30


def _cfg(path, **kw) -> LearnerConfig:
    return LearnerConfig(model=str(path), **kw)


def test_auto_levers_leave_the_cpu_exact(tiny_model_dir):
    policy = Policy.load(tiny_model_dir, device="cpu")
    plan = plan_speed(_cfg(tiny_model_dir), policy.model, torch.device("cpu"), sharded=False)
    assert plan.param_dtype == torch.float32 and not plan.packing and not plan.fused_adamw
    assert plan.attn_implementation is None and plan.gradient_checkpointing is None
    assert not plan.compile
    trainer = Trainer(policy, _cfg(tiny_model_dir))
    assert trainer.master is None and not policy.packing
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())


def test_auto_levers_on_cuda_threaded_through_the_device_argument(tiny_model_dir):
    """Decided from the device argument alone (no GPU needed to plan)."""
    model = Policy.load(tiny_model_dir, device="cpu").model
    cuda = torch.device("cuda")
    plan = plan_speed(_cfg(tiny_model_dir, gradient_checkpointing=False), model, cuda, False)
    assert plan.param_dtype == torch.bfloat16 and plan.packing and plan.fused_adamw
    assert plan.attn_implementation in ("flash_attention_2", varlen.NAME) and plan.compile
    sharded = plan_speed(_cfg(tiny_model_dir, gradient_checkpointing=False), model, cuda, True)
    assert sharded.param_dtype == torch.float32 and not sharded.packing
    with pytest.raises(ValueError, match="FSDP2"):
        plan_speed(_cfg(tiny_model_dir, param_dtype="bfloat16"), model, cuda, True)
    f32 = plan_speed(_cfg(tiny_model_dir, param_dtype="float32", gradient_checkpointing=False),
                     model, cuda, False)
    assert not f32.packing and f32.attn_implementation is None  # no fp32 flash kernels
    assert not f32.compile  # measured for bf16 only
    assert _cfg(tiny_model_dir, compile=True).compile == "on"  # booleans of older configs
    assert _cfg(tiny_model_dir, compile=False).compile == "off"
    f32_on = plan_speed(_cfg(tiny_model_dir, param_dtype="float32", packing="on",
                             gradient_checkpointing=False), model, cuda, False)
    assert f32_on.packing and f32_on.attn_implementation == varlen.NAME  # per sequence
    off = plan_speed(_cfg(tiny_model_dir, packing="off", param_dtype="float32",
                          gradient_checkpointing=False), model, cuda, False)
    assert not off.packing and off.attn_implementation is None
    assert off.param_dtype == torch.float32


def test_auto_levers_on_a_gpu_older_than_ampere(tiny_model_dir, monkeypatch):
    """No bf16 matrix units or FlashAttention-2 there: "auto" keeps float32 weights, padded
    batches and eager layers (what ran before these levers existed)."""
    from gspo_rl.learner.model import speed

    monkeypatch.setattr(speed, "ampere_or_newer", lambda device: False)
    model = Policy.load(tiny_model_dir, device="cpu").model
    plan = plan_speed(_cfg(tiny_model_dir, gradient_checkpointing=False), model,
                      torch.device("cuda"), False)
    assert plan.param_dtype == torch.float32 and not plan.packing and not plan.compile
    assert plan.attn_implementation is None and plan.fused_adamw


def _qwen(hidden: int, layers: int, inter: int) -> Qwen2Config:
    return Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter)


@pytest.mark.parametrize("shape,n_params,tokens,expect", [
    ((896, 24, 4864), 494_000_000, 16384, False),   # Qwen2.5-0.5B, the default budget
    ((896, 24, 4864), 494_000_000, 65536, True),    # ... 4x the tokens
    ((1536, 28, 8960), 1_544_000_000, 32768, True),  # Qwen2.5-1.5B
    ((1536, 28, 8960), 1_544_000_000, 4096, False),
])
def test_checkpointing_is_chosen_by_size_on_an_80_gib_gpu(shape, n_params, tokens, expect):
    assert needs_checkpointing(_qwen(*shape), n_params, tokens, True, 80 * GIB) is expect


def test_master_weights_keep_updates_bf16_weights_would_lose(tiny_model_dir):
    model = Policy.load(tiny_model_dir, device="cpu").model
    before = [p.detach().clone() for p in model.parameters()]
    mw = MasterWeights(model, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(m.dtype == torch.float32 for m in mw.master)
    for m, b in zip(mw.master, before, strict=True):
        assert torch.equal(m, b)  # the masters are the exact float32 weights
    for _ in range(2):  # two microbatches: gradients accumulate in float32
        for p in mw.params:
            p.grad = torch.full_like(p, 1e-3)
        mw.accumulate_grads()
        assert all(p.grad is None for p in mw.params)
    g = 2 * float(torch.tensor(1e-3, dtype=torch.bfloat16))
    assert all(torch.equal(m.grad, torch.full_like(m, g)) for m in mw.master)
    plain = [p.detach().clone() for p in mw.params]  # bf16 weights updated directly
    with torch.no_grad():
        for _ in range(200):  # 200 updates of 5e-5: each below bf16's resolution at |w| ~ 1
            for m, q in zip(mw.master, plain, strict=True):
                m.add_(5e-5)
                q.add_(5e-5)
    mw.copy_to_model()
    big = [b.abs() > 0.5 for b in before]
    for p, q, b, k in zip(mw.params, plain, before, big, strict=True):
        if k.any():
            shift = (p.float() - b)[k]
            assert float((shift - 1e-2).abs().max()) < 5e-3  # kept via the masters
            assert torch.equal(q[k], b.to(torch.bfloat16)[k])  # lost in plain bf16


def test_bf16_trainer_steps_masters_and_round_trips_them(tiny_model_dir):
    torch.manual_seed(0)
    policy = Policy.load(tiny_model_dir, device="cpu")
    groups = [sample_group(policy.model, group_size=4, prompt_len=3, new_tokens=(2, 7),
                           temperature=1.0, seed=k) for k in range(2)]
    cfg = _cfg(tiny_model_dir, param_dtype="bfloat16", packing="on", lr=1e-3, grad_clip=None)
    trainer = Trainer(policy, cfg)
    start = [m.detach().clone() for m in trainer.master.master]
    metrics = trainer.step(groups)
    assert metrics["optimizer_steps"] == 1.0 and metrics["padding_fraction"] == 0.0
    assert any(not torch.equal(m, s) for m, s in zip(trainer.master.master, start, strict=True))
    for p, m in zip(trainer.master.params, trainer.master.master, strict=True):
        assert p.dtype == torch.bfloat16 and torch.equal(p, m.to(torch.bfloat16))
    state = trainer.state_dict()
    fresh = Trainer(Policy.load(tiny_model_dir, device="cpu"), cfg)
    fresh.load_state_dict(state)
    for a, b in zip(fresh.master.master, trainer.master.master, strict=True):
        assert torch.equal(a, b)
    # a float32 learner resuming the bf16 run takes the masters, not the rounded weights
    exact = Trainer(Policy.load(tiny_model_dir, device="cpu"), _cfg(tiny_model_dir))
    exact.load_state_dict({k: v for k, v in state.items() if k != "optimizer"}
                          | {"optimizer": exact.optimizer.state_dict()})
    for p, m in zip(exact.params, trainer.master.master, strict=True):
        assert torch.equal(p, m)


def test_bf16_trainer_loads_a_name_keyed_optimizer_state(tiny_model_dir):
    """An FSDP2 checkpoint's optimizer state (keyed by parameter name) resumes into the
    masters of an unsharded bf16 learner."""
    from gspo_rl.learner.parallel.fsdp import FULL_FORMAT, ids_to_names

    torch.manual_seed(0)
    src = Trainer(Policy.load(tiny_model_dir, device="cpu"), _cfg(tiny_model_dir, lr=1e-3))
    src.step([sample_group(src.policy.model, group_size=4, prompt_len=3, new_tokens=(2, 7),
                           temperature=1.0, seed=0)])
    names = [n for n, p in src.policy.model.named_parameters() if p.requires_grad]
    state = {"optimizer": ids_to_names(src.optimizer.state_dict(), names),
             "optimizer_format": FULL_FORMAT, "scheduler": src.scheduler.state_dict()}
    dst = Trainer(Policy.load(tiny_model_dir, device="cpu"),
                  _cfg(tiny_model_dir, param_dtype="bfloat16"))
    dst.load_state_dict(state)
    for m, p in zip(dst.master.master, src.params, strict=True):
        assert torch.equal(dst.optimizer.state[m]["exp_avg_sq"],
                           src.optimizer.state[p]["exp_avg_sq"])

@pytest.mark.gpu
def test_cuda_packed_forward_matches_padded_in_bf16(tiny_model_dir):
    """The variable-length attention picked for CUDA (flash-attention-2 or
    gspo_rl.learner.model.varlen) keeps each sequence to itself: packed log-probs equal the padded
    ones up to bf16 noise."""
    from gspo_rl.learner.model.speed import apply_speed

    cpu = Policy.load(tiny_model_dir, device="cpu")
    groups = [sample_group(cpu.model, group_size=4, prompt_len=3 + k, new_tokens=(2, 9),
                           temperature=1.0, seed=k) for k in range(3)]
    from gspo_rl.learner.data.batching import collate, samples_from_groups

    mb = collate(samples_from_groups(groups))
    policy = Policy.load(tiny_model_dir, device="cuda")
    plan = plan_speed(_cfg(tiny_model_dir), policy.model, policy.device, sharded=False)
    MasterWeights(policy.model, plan.param_dtype)
    apply_speed(policy, plan)
    assert policy.packing
    args = (mb.tokens_BT, mb.attention_BT, mb.temperature_B, mb.mask_BT)
    packed = policy.token_logprobs(*args)
    policy.packing = False
    padded = policy.token_logprobs(*args)
    ref = cpu.token_logprobs(*args).cuda()
    mask = mb.mask_BT.cuda() > 0
    assert float((packed - padded)[mask].abs().max()) < 0.05
    assert float((packed - ref)[mask].abs().max()) < 0.1


@pytest.mark.gpu
def test_cuda_trainer_uses_bf16_masters_and_fused_adamw(tiny_model_dir):
    policy = Policy.load(tiny_model_dir, device="cuda")
    groups = [sample_group(Policy.load(tiny_model_dir, device="cpu").model, group_size=4,
                           prompt_len=3, new_tokens=(2, 7), temperature=1.0, seed=k)
              for k in range(2)]
    trainer = Trainer(policy, _cfg(tiny_model_dir, lr=1e-3))
    assert trainer.master is not None and trainer.optimizer.defaults["fused"]
    assert all(p.dtype == torch.bfloat16 and p.is_cuda for p in policy.model.parameters())
    assert all(m.dtype == torch.float32 and m.is_cuda for m in trainer.master.master)
    metrics = trainer.step(groups)
    assert metrics["optimizer_steps"] == 1.0 and metrics["padding_fraction"] == 0.0
    for p, m in zip(trainer.master.params, trainer.master.master, strict=True):
        assert torch.equal(p, m.to(torch.bfloat16))
    assert not any(k.is_cuda for k in trainer.state_dict()["master_weights"])


@pytest.mark.gpu
def test_cuda_fused_head_in_bf16_matches_float32_reference():
    from gspo_rl.learner.model.logprob_head import fused_logprobs

    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(300, 64, device="cuda", generator=g).bfloat16().requires_grad_(True)
    w = (torch.randn(5000, 64, device="cuda", generator=g) * 0.1).bfloat16()
    w.requires_grad_(True)
    t = torch.full((300,), 0.8, device="cuda")
    y = torch.randint(0, 5000, (300,), device="cuda", generator=g)
    got = fused_logprobs(h, w, y, temperature_N=t, chunk_elems=5000 * 64)
    ref = torch.log_softmax((h.float() @ w.float().T) / 0.8, -1).gather(1, y[:, None])[:, 0]
    assert got.dtype == torch.float32
    assert float((got - ref).abs().max()) < 0.05
    got.sum().backward()
    assert h.grad.dtype == torch.bfloat16 and torch.isfinite(w.grad).all()
