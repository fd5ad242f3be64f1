"""FSDP2 learner (``gspo_rl.learner.parallel.fsdp``): the pure parts, and a real 2-rank torchrun
(gloo, CPU) job that must train, push and checkpoint what one process does, across a resume."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from gspo_rl.contract.queue.schema import READY_STREAM_FIELD, Keys, pack_ready_group
from gspo_rl.learner.algorithm.advantages import advantage_fn_for
from gspo_rl.learner.checkpoint import list_checkpoints
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.data.batching import plan_step
from gspo_rl.learner.loop import Learner
from gspo_rl.learner.model.policy import Policy
from gspo_rl.learner.parallel.distributed import assign_owners
from gspo_rl.learner.parallel.fsdp import (
    FULL_FORMAT,
    check_names,
    decoder_layers,
    fsdp_share,
    hf_name,
    ids_to_names,
    load_optimizer_state,
)
from gspo_rl.learner.trainer import Trainer
from gspo_rl.learner.weights.base import NoSync
from gspo_rl.learner.weights.broadcast import named_weights
from tests.helpers.learner_data import sample_group


def test_hf_name_strips_wrapper_prefixes_and_check_names_catches_mismatch():
    assert hf_name("model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight") == \
        "model.layers.0.mlp.up_proj.weight"
    assert hf_name("_orig_mod.lm_head.weight") == "lm_head.weight"
    assert hf_name("model.norm.weight") == "model.norm.weight"
    check_names(["a", "b"], ["b", "a"])
    with pytest.raises(ValueError, match="differ"):
        check_names(["a", "b"], ["a", "c"])


def test_decoder_layers_are_the_hf_blocks(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    layers = decoder_layers(model)
    assert layers == list(model.model.layers) and len(layers) == 2


def test_fsdp_share_pads_every_rank_to_the_same_pass_count(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    groups = [sample_group(model, group_size=5, seed=k) for k in range(2)]
    plan = plan_step(groups, 1, 24, advantage_fn_for("gspo"), min_micro=3)
    mb = plan.minibatches[0]
    owners = assign_owners([m.n_padded_tokens for m in mb.micro], 3)
    shares = [fsdp_share(mb, owners, r, 3) for r in range(3)]
    passes = {len(s.micro) + s.n_pad for s in shares}
    assert len(passes) == 1 and passes.pop() == max(len(s.micro) for s in shares)
    assert sorted(id(m) for s in shares for m in s.micro) == sorted(
        id(m) for m in mb.micro if m.n_valid > 0)  # every trained microbatch exactly once
    assert all(s.pad is not None and s.pad.n_valid > 0 for s in shares if s.n_pad)


def _trained(tiny_model_dir: Path, steps: int = 2) -> tuple[Trainer, list]:
    cfg = LearnerConfig(model=str(tiny_model_dir), device="cpu", lr=1e-3, micro_batch_tokens=24)
    policy = Policy.load(tiny_model_dir, "cpu")
    trainer = Trainer(policy, cfg)
    groups = [sample_group(policy.model, group_size=3, seed=k) for k in range(steps)]
    for g in groups:
        trainer.step([g])
    return trainer, groups


def test_name_keyed_optimizer_state_loads_into_an_unsharded_trainer(tiny_model_dir):
    trainer, _ = _trained(tiny_model_dir)
    plain = trainer.state_dict()
    names = [n for n, p in trainer.policy.model.named_parameters() if p.requires_grad]
    keyed = ids_to_names(plain["optimizer"], names)
    assert set(keyed["state"]) == set(names) and keyed["param_groups"][0]["params"] == names
    for state, fmt in ((plain, None), ({**plain, "optimizer": keyed,
                                        "optimizer_format": FULL_FORMAT}, FULL_FORMAT)):
        fresh = Trainer(Policy.load(tiny_model_dir, "cpu"), trainer.config)
        fresh.load_state_dict(state)
        got, want = fresh.optimizer.state_dict()["state"], plain["optimizer"]["state"]
        assert set(got) == set(want), fmt
        for i in want:
            assert torch.equal(got[i]["exp_avg_sq"], want[i]["exp_avg_sq"]), (fmt, i)
            assert float(got[i]["step"]) == float(want[i]["step"]) == 2.0
    with pytest.raises(RuntimeError, match="optimizer state"):  # names the model lacks
        bad = {**keyed, "state": {"nope": keyed["state"][names[0]]}}
        load_optimizer_state(fresh.policy.model, fresh.optimizer,
                             {**bad, "param_groups": [{**keyed["param_groups"][0],
                                                       "params": ["nope"]}]}, True)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def _dist(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return sum(float((a[k] - b[k]).norm() ** 2) for k in a) ** 0.5


def _write_toml(path: Path, fields: dict) -> None:
    loss = fields.pop("loss")
    path.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in fields.items())
                    + f'\n[loss]\nkind = "{loss["kind"]}"\n')


def _pad_passes(groups: list, common: dict) -> int:
    """How many zero-weight passes the 2-rank FSDP job must run on ``groups``."""
    n = 0
    for k in range(0, len(groups), common["groups_per_step"]):
        plan = plan_step(groups[k:k + common["groups_per_step"]], common["minibatches"],
                         common["micro_batch_tokens"], advantage_fn_for("gspo"), min_micro=2)
        for mb in plan.minibatches:
            owners = assign_owners([m.n_padded_tokens for m in mb.micro], 2)
            n += sum(fsdp_share(mb, owners, r, 2).n_pad for r in (0, 1))
    return n


@pytest.mark.slow
def test_torchrun_fsdp2_trains_pushes_and_resumes_like_one_process(tiny_model_dir, redis_url,
                                                                   tmp_path):
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    client = redis.Redis.from_url(redis_url)
    sampler = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    groups = [sample_group(sampler, group_size=3, prompt_len=3, new_tokens=(2, 7), seed=k,
                           group_id=f"g{k}") for k in range(6)]
    for prefix in ("one", "two"):
        for g in groups:
            client.xadd(Keys(prefix).ready_stream, {READY_STREAM_FIELD: pack_ready_group(g)})
    common = dict(model=str(tiny_model_dir), redis_url=redis_url, groups_per_step=2,
                  minibatches=2, micro_batch_tokens=24, lr=1e-3, read_timeout_s=0.5,
                  device="cpu", console=False, save_every=1, keep_last=5,
                  loss={"kind": "gspo"}, old_logprobs="recompute")
    assert _pad_passes(groups, common) > 0  # the uneven split is exercised
    Learner(LearnerConfig(**common, key_prefix="one", save_dir=str(tmp_path / "one"),
                          max_steps=3), client=client, sync=NoSync()).run()

    toml = tmp_path / "two.toml"
    _write_toml(toml, {**common, "key_prefix": "two", "save_dir": str(tmp_path / "two"),
                       "max_steps": 2, "data_parallel": "fsdp2"})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    run = [torchrun, "--standalone", "--nproc-per-node", "2", "-m"]
    r = subprocess.run(run + ["tests.helpers.fsdp_probe", str(toml), str(tmp_path / "pushed")],
                       capture_output=True, text=True, env=env, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run(run + ["gspo_rl.cli", "learn", "--config", str(toml), "--resume",
                              "--max-steps", "3", "--data-parallel", "fsdp2"],
                       capture_output=True, text=True, env=env, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    one = {c.state.step: c for c in list_checkpoints(tmp_path / "one")}
    two = {c.state.step: c for c in list_checkpoints(tmp_path / "two")}
    assert sorted(one) == sorted(two) == [1, 2, 3]
    assert two[3].state.groups_trained == 6
    w0 = _weights(Path(tiny_model_dir) / "model.safetensors")
    for step in (1, 2, 3):  # 3: after the resume (optimiser state restored from rank 0's file)
        w1 = _weights(one[step].path / "model.safetensors")
        w2 = _weights(two[step].path / "model.safetensors")
        assert set(w2) == set(w1) == set(w0)  # plain HF names, the tied head not duplicated
        assert all(w2[k].shape == w0[k].shape for k in w0)  # full tensors, not shards
        assert _dist(w1, w2) < 1e-3 * _dist(w1, w0), step
    pushed = {v: _weights(tmp_path / "pushed" / f"v{v}.safetensors") for v in (1, 2)}
    names = [n for n, _ in named_weights(sampler)]
    for v, w in pushed.items():
        assert list(w) == names or sorted(w) == sorted(names)
        ckpt = _weights(two[v].path / "model.safetensors")
        assert all(torch.equal(w[k], ckpt[k]) for k in w), v  # a push is the saved weights
    state = torch.load(two[2].path / "trainer_state.pt", weights_only=False)
    assert state["optimizer_format"] == FULL_FORMAT
    assert set(state["optimizer"]["state"]) == set(names)  # full state, keyed by HF name
    recs = {p: [x for x in map(json.loads, (tmp_path / p / "metrics.jsonl").read_text()
                               .splitlines()) if x.get("event") == "step"] for p in ("one", "two")}
    assert [x["ranks"] for x in recs["two"]] == [2, 2, 2]
    for a, b in zip(recs["one"], recs["two"], strict=True):  # Adam hides a gradient's scale
        for k in ("loss", "grad_norm", "is_weight_mean"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (a["step"], k)
