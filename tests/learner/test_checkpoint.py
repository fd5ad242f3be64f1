"""gspo_rl.learner.checkpoint.store: round trip incl. optimiser state and RNG, atomicity,
retention."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

import gspo_rl.learner.checkpoint.store as ckpt_mod
from gspo_rl.learner.checkpoint.store import (
    LearnerState,
    list_checkpoints,
    load_latest,
    remove_partial,
    restore_rng,
    save_checkpoint,
)
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.model.policy import Policy
from gspo_rl.learner.trainer import Trainer
from tests.helpers.learner_data import sample_group


def _trainer(path, tiny_model_dir) -> Trainer:
    cfg = LearnerConfig(model=str(tiny_model_dir), lr=1e-3, warmup_steps=3, minibatches=2)
    return Trainer(Policy.load(path, device="cpu"), cfg)


def test_round_trip_restores_weights_optimizer_schedule_and_rng(tiny_model_dir, tmp_path):
    t1 = _trainer(tiny_model_dir, tiny_model_dir)
    groups = [sample_group(t1.policy.model, seed=k) for k in range(3)]
    t1.step(groups)
    torch.manual_seed(123)
    random.seed(5)
    state = LearnerState(step=1, version=1, entry_ids=["1-0", "2-0"], groups_trained=3)
    path = save_checkpoint(tmp_path, t1.policy.model, t1.state_dict(), state,
                           tokenizer_src=tiny_model_dir)
    expect_torch, expect_py = torch.rand(3), random.random()

    latest = load_latest(tmp_path)
    assert latest is not None and latest.path == path
    assert latest.state.entry_ids == ["1-0", "2-0"] and latest.state.version == 1
    t2 = _trainer(path, tiny_model_dir)
    ts = latest.trainer_state()
    t2.load_state_dict(ts)
    restore_rng(ts["rng"])
    assert torch.equal(torch.rand(3), expect_torch) and random.random() == expect_py
    for a, b in zip(t1.policy.model.parameters(), t2.policy.model.parameters(), strict=True):
        assert torch.equal(a, b)
    s1, s2 = t1.optimizer.state_dict(), t2.optimizer.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for k, v in s1["state"].items():
        for name, x in v.items():
            assert torch.equal(x, s2["state"][k][name]), (k, name)
    # the same next step from both gives the same weights (schedule and moments restored)
    t1.step(groups)
    t2.step(groups)
    for a, b in zip(t1.policy.model.parameters(), t2.policy.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # a Hugging Face directory: the tokenizer was copied and loads
    tok = AutoTokenizer.from_pretrained(str(path))
    assert tok.chat_template and tok.eos_token == "<|im_end|>"


def test_tied_embeddings_stay_tied(tiny_model_dir, tmp_path):
    t = _trainer(tiny_model_dir, tiny_model_dir)
    t.step([sample_group(t.policy.model, seed=0)])
    path = save_checkpoint(tmp_path, t.policy.model, t.state_dict(), LearnerState(1, 1))
    m = Policy.load(path, device="cpu").model
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    assert torch.equal(m.lm_head.weight, t.policy.model.lm_head.weight)


def test_keep_last_and_ordering(tiny_model_dir, tmp_path):
    model = Policy.load(tiny_model_dir, device="cpu").model
    for step in (1, 2, 3, 10):
        save_checkpoint(tmp_path, model, {}, LearnerState(step, step), keep_last=2)
    assert [c.state.step for c in list_checkpoints(tmp_path)] == [3, 10]
    assert load_latest(tmp_path).state.step == 10
    assert load_latest(tmp_path / "nothing") is None


def test_a_crash_mid_save_leaves_the_previous_checkpoint(tiny_model_dir, tmp_path,
                                                         monkeypatch):
    model = Policy.load(tiny_model_dir, device="cpu").model
    save_checkpoint(tmp_path, model, {}, LearnerState(1, 1, ["a"]))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_mod.torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, model, {}, LearnerState(2, 2, ["b"]))
    assert [c.state.step for c in list_checkpoints(tmp_path)] == [1]
    assert load_latest(tmp_path).state.entry_ids == ["a"]
    assert remove_partial(tmp_path) == [f".tmp-step-00000002-{os.getpid()}"]
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())


class _Exploit:
    """A pickle that runs code on load (what weights_only=False would execute)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_trainer_state_loads_weights_only_and_refuses_code(tiny_model_dir, tmp_path):
    t = _trainer(tiny_model_dir, tiny_model_dir)
    t.step([sample_group(t.policy.model, seed=0)])
    path = save_checkpoint(tmp_path, t.policy.model, t.state_dict(), LearnerState(1, 1))
    # Optimiser, schedule and every RNG state are tensors and plain containers.
    plain = torch.load(path / ckpt_mod.TRAINER_FILE, weights_only=True)
    assert set(plain["rng"]) >= {"torch", "numpy", "python"}
    marker = tmp_path / "pwned"
    torch.save({"optimizer": _Exploit(str(marker))}, path / ckpt_mod.TRAINER_FILE)
    with pytest.raises(Exception, match="[Ww]eights only"):
        load_latest(tmp_path).trainer_state()
    assert not marker.exists()


def _rng_draws() -> tuple[torch.Tensor, float, float]:
    return torch.rand(4), float(np.random.rand()), random.random()


def test_rng_states_restore_from_any_dtype_they_were_loaded_as(tiny_model_dir, tmp_path):
    """restore_rng hands torch CPU ByteTensors, however the file was loaded (map_location
    may move and cast the tensors: ``RNG state must be a torch.ByteTensor``)."""
    model = Policy.load(tiny_model_dir, device="cpu").model
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    path = save_checkpoint(tmp_path, model, {}, LearnerState(1, 1))
    expect = _rng_draws()
    rng = load_latest(tmp_path).trainer_state()["rng"]
    rng["torch"] = rng["torch"].to(torch.int64)  # not a ByteTensor any more
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    restore_rng(rng)
    got = _rng_draws()
    assert torch.equal(got[0], expect[0]) and got[1:] == expect[1:]
    assert path.name == "step-00000001"


@pytest.mark.gpu
def test_rng_states_restore_after_loading_onto_cuda(tiny_model_dir, tmp_path):
    """The resume path loads the trainer state with map_location=<the policy's device>: on a
    GPU machine every RNG tensor lands on CUDA, and both CPU and CUDA states must restore."""
    model = Policy.load(tiny_model_dir, device="cpu").model
    torch.manual_seed(11)
    torch.cuda.manual_seed_all(11)
    save_checkpoint(tmp_path, model, {}, LearnerState(1, 1))
    expect_cpu, expect_cuda = torch.rand(4), torch.rand(4, device="cuda")
    rng = load_latest(tmp_path).trainer_state(map_location="cuda")["rng"]
    assert rng["torch"].device.type == "cuda"
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    restore_rng(rng)
    assert torch.equal(torch.rand(4), expect_cpu)
    assert torch.equal(torch.rand(4, device="cuda"), expect_cuda)
