"""LoRA adapters on the wire (gspo_rl.contract.weights.lora) and the learner's side of them
(gspo_rl.learner.weights.adapter): the payload PEFT's layers give, the merge a server does
(``W0 + alpha/r * B @ A``, from ``W0`` every time), and the refusals of malformed pushes."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from gspo_rl.contract.weights.lora import BaseCopy, LoraSpec, adapter_pairs, merged_weight
from gspo_rl.learner.weights.adapter import lora_payload
from gspo_rl.learner.weights.broadcast import push_payload
from tests.helpers.reference_logprobs import sequence_logprobs

SPEC = LoraSpec(rank=2, alpha=4.0, target_modules=["q_proj"])


def _peft(model_dir, targets=("q_proj", "v_proj", "down_proj")):
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=list(targets)))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:  # as after some training: B is no longer zero
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def test_the_payload_is_the_adapter_and_merging_it_gives_the_learners_function(
        tiny_model_dir):
    model = _peft(tiny_model_dir)
    named, spec = push_payload(model)
    assert spec == LoraSpec(rank=4, alpha=8.0, target_modules=["down_proj", "q_proj", "v_proj"])
    assert all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n, _ in named)
    assert "model.layers.0.self_attn.q_proj.lora_A.weight" in dict(named)
    full = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert sum(t.numel() for _, t in named) < full / 10
    # a server's copy of the base, merged: the same log-probabilities as the PEFT model
    server = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    params = dict(server.named_parameters())
    base = BaseCopy()
    with torch.no_grad():
        for n, w in base.merge(params, named, spec):
            params[n].copy_(w)
    ids = [5, 17, 42, 99, 7, 300, 12, 8]
    with torch.no_grad():
        ours = sequence_logprobs(model, ids, 3, 0.7)
        theirs = sequence_logprobs(server, ids, 3, 0.7)
    torch.testing.assert_close(torch.tensor(theirs), torch.tensor(ours), atol=1e-5, rtol=0)


def test_a_model_without_adapters_pushes_every_weight(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    assert lora_payload(model) is None
    named, spec = push_payload(model)
    assert spec is None and len(named) == len(list(model.parameters()))


def test_each_push_merges_from_w0_and_untargeted_weights_go_back():
    w0 = torch.randn(6, 5)
    params = {"x.q_proj.weight": w0.clone(), "x.k_proj.weight": w0.clone() * 2}
    base = BaseCopy()
    a, b = torch.randn(2, 5), torch.randn(6, 2)
    out = dict(base.merge(params, [("x.q_proj.lora_A.weight", a),
                                   ("x.q_proj.lora_B.weight", b)], SPEC))
    torch.testing.assert_close(out["x.q_proj.weight"], w0 + 2.0 * b @ a)
    params["x.q_proj.weight"] = out["x.q_proj.weight"]  # the engine loaded it
    # the next adapter merges into W0 again, not into the merged weight
    out = dict(base.merge(params, [("x.q_proj.lora_A.weight", a),
                                   ("x.q_proj.lora_B.weight", 2 * b)], SPEC))
    torch.testing.assert_close(out["x.q_proj.weight"], w0 + 4.0 * b @ a)
    # an adapter on k_proj only: q_proj gets W0 back
    out = dict(base.merge(params, [("x.k_proj.lora_A.weight", a),
                                   ("x.k_proj.lora_B.weight", b)], SPEC))
    assert torch.equal(out["x.q_proj.weight"], w0)
    base.forget()
    assert base.nbytes == 0
    bf16 = merged_weight(w0.bfloat16(), a, b, 2.0)
    assert bf16.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merging_in_place_writes_what_merge_returns(dtype):
    w0 = torch.randn(6, 5).to(dtype)
    params = {"x.q_proj.weight": w0.clone(), "x.k_proj.weight": w0 * 2}
    ref = {n: p.clone() for n, p in params.items()}  # loaded from merge's list
    in_place, listed = BaseCopy(), BaseCopy()
    a, b = torch.randn(2, 5), torch.randn(6, 2)
    q = [("x.q_proj.lora_A.weight", a), ("x.q_proj.lora_B.weight", b)]
    k = [("x.k_proj.lora_A.weight", a), ("x.k_proj.lora_B.weight", 3 * b)]
    for push in (q, k, q):
        ref.update(listed.merge(ref, push, SPEC))
        in_place.merge_into(params, push, SPEC)
        for name, w in params.items():
            assert w.dtype == dtype and torch.equal(w, ref[name]), name
    assert torch.equal(params["x.k_proj.weight"], w0 * 2)  # back to W0 under q's adapter
    before = {n: p.clone() for n, p in params.items()}
    with pytest.raises(ValueError, match="B @ A"):  # a bad push writes nothing
        in_place.merge_into(params, [*q, ("x.k_proj.lora_A.weight", torch.zeros(2, 4)),
                                     ("x.k_proj.lora_B.weight", torch.zeros(6, 2))], SPEC)
    assert all(torch.equal(params[n], before[n]) for n in params)


@pytest.mark.parametrize("named, message", [
    ([("x.q_proj.weight", torch.zeros(6, 5))], "not a LoRA tensor"),
    ([("x.q_proj.lora_A.weight", torch.zeros(2, 5))], "without their pair"),
    ([("x.q_proj.lora_A.weight", torch.zeros(3, 5)),
      ("x.q_proj.lora_B.weight", torch.zeros(6, 3))], "r = 2"),
])
def test_malformed_pushes_are_refused(named, message):
    with pytest.raises(ValueError, match=message):
        adapter_pairs(named, SPEC)


def test_an_adapter_for_another_model_changes_nothing():
    params = {"x.q_proj.weight": torch.zeros(6, 5)}
    base = BaseCopy()
    with pytest.raises(KeyError, match="does not have"):
        base.merge(params, [("y.q_proj.lora_A.weight", torch.zeros(2, 5)),
                            ("y.q_proj.lora_B.weight", torch.zeros(6, 2))], SPEC)
    with pytest.raises(ValueError, match="B @ A"):
        base.merge(params, [("x.q_proj.lora_A.weight", torch.zeros(2, 4)),
                            ("x.q_proj.lora_B.weight", torch.zeros(6, 2))], SPEC)
    assert base.w0 == {}
