"""FSDP2 learner (``gspo_rl.learner.parallel.fsdp``): the pure parts, and a real 2-rank torchrun
(gloo, CPU) job, full fine-tuning or LoRA, that must train, push and checkpoint what one process
does, across a resume under FSDP2 and a resume of its checkpoint by one process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from gspo_rl.contract.schema import READY_STREAM_FIELD, Keys, pack_ready_group
from gspo_rl.learner.algorithm.advantages import advantage_fn_for
from gspo_rl.learner.checkpoint.store import list_checkpoints
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
    gather_full,
    hf_name,
    ids_to_names,
    load_host_copy,
    load_optimizer_state,
)
from gspo_rl.learner.trainer import Trainer
from gspo_rl.learner.weights.base import NoSync
from gspo_rl.learner.weights.broadcast import push_payload
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


@torch.no_grad()
def test_gather_full_copies_only_what_trains_into_the_lora_host_copy(tiny_model_dir):
    cfg = LearnerConfig(model=str(tiny_model_dir), device="cpu", lora_rank=4, lora_alpha=8.0)
    policy = Policy.load(tiny_model_dir, "cpu", lora=cfg)
    rng = torch.get_rng_state()
    host, peft = load_host_copy(tiny_model_dir, cfg)
    assert torch.equal(torch.get_rng_state(), rng)  # the job's random draws are untouched
    assert peft is not None and peft.base_model.model is host
    src = dict(policy.model.named_parameters())
    for p in src.values():  # what the trained model holds: moved adapters, a moved base
        p.add_(1.0)
    gather_full(policy.model, host)
    for name, p in host.named_parameters():  # the frozen base is never read, never held
        assert torch.equal(p, src[name]) if src[name].requires_grad else p.is_meta, name
    assert peft.peft_config["default"].base_model_name_or_path == \
        policy.peft.peft_config["default"].base_model_name_or_path  # what checkpoints record
    assert {n for n, p in host.named_parameters() if p.requires_grad} == {
        n for n, p in src.items() if ".lora_A." in n or ".lora_B." in n}
    plain, _ = load_host_copy(tiny_model_dir)  # full fine-tuning's host: different names
    with pytest.raises(ValueError, match="differ"):
        gather_full(policy.model, plain)


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


def _saved(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's trained tensors, named as a push names them: ``model.safetensors``, or a
    LoRA checkpoint's adapter (PEFT's ``base_model.model.`` prefix removed)."""
    adapter = path / "adapter_model.safetensors"
    if adapter.is_file():
        return {k.removeprefix("base_model.model."): v for k, v in load_file(adapter).items()}
    return load_file(str(path / "model.safetensors"))


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


def _queue(client: redis.Redis, prefix: str, groups: list) -> None:
    for g in groups:
        client.xadd(Keys(prefix).ready_stream, {READY_STREAM_FIELD: pack_ready_group(g)})


def _torchrun_two_ranks(common: dict, tmp_path: Path, cli: list[str]) -> None:
    """Steps 1-2 under a 2-rank FSDP2 job (pushes written by ``tests.helpers.fsdp_probe``),
    then ``gspo learn --resume`` to step 3 in a new job."""
    toml = tmp_path / "two.toml"
    _write_toml(toml, {**common, "key_prefix": "two", "save_dir": str(tmp_path / "two"),
                       "max_steps": 2, "data_parallel": "fsdp2"})
    _torchrun(["tests.helpers.fsdp_probe", str(toml), str(tmp_path / "pushed")])
    _torchrun(["gspo_rl.cli", "learn", "--config", str(toml), "--resume", "--max-steps", "3",
               "--data-parallel", "fsdp2", *cli])


def _torchrun(module_args: list[str]) -> None:
    """``torchrun -m`` with 2 ranks on this machine; fails the test with its output."""
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", *module_args],
                       capture_output=True, text=True, env=env, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def _fsdp2_resumes_one(common: dict, tmp_path: Path, client: redis.Redis, groups: list,
                       checkpoint: Path) -> dict[int, Any]:
    """World size 1 -> 2: a 2-rank FSDP2 job resumes the single process's step-2 checkpoint
    (its id-keyed optimizer state, its PEFT adapter directory) to step 3. Its checkpoints."""
    shutil.copytree(checkpoint, tmp_path / "four" / "step-00000002")
    _queue(client, "four", groups[4:])
    toml = tmp_path / "four.toml"
    _write_toml(toml, {**common, "key_prefix": "four", "save_dir": str(tmp_path / "four"),
                       "max_steps": 3, "data_parallel": "fsdp2"})
    _torchrun(["gspo_rl.cli", "learn", "--config", str(toml), "--resume"])
    return {c.state.step: c for c in list_checkpoints(tmp_path / "four")}


def _check_pushes(tmp_path: Path, two: dict, one: Learner) -> dict[int, dict]:
    """Each push (0: the start-up one) is exactly what a single process of the same kind would
    push (its names and LoRA spec) and, after a step, exactly the saved weights of that
    version. Returns the pushed tensors by version."""
    names, spec = push_payload(one.policy.model)
    pushed = {}
    for v in (0, 1, 2):
        file = tmp_path / "pushed" / f"v{v}.safetensors"
        with safe_open(str(file), "pt") as f:
            meta = (f.metadata() or {}).get("lora")
        assert meta == (spec.model_dump_json() if spec is not None else None)
        pushed[v] = w = load_file(str(file))
        assert sorted(w) == sorted(n for n, _ in names)
        assert spec is None or all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in w)
        if v:
            ckpt = _saved(two[v].path)
            assert all(torch.equal(w[k], ckpt[k]) for k in w), v  # a push is the saved weights
    return pushed


def _check_metrics(recs: dict[str, list[dict]], ranks: dict[str, list[int]]) -> None:
    """Step records of every run equal the single process's (Adam hides a gradient's scale, so
    the loss and the gradient norm are checked too)."""
    for name, want in ranks.items():
        assert [x["ranks"] for x in recs[name]] == want, name
        for b in recs[name]:
            a = recs["one"][b["step"] - 1]
            for k in ("loss", "grad_norm", "is_weight_mean"):
                assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (name, b["step"], k)


def _check_checkpoints(runs: dict[str, dict], one: Learner, w0: dict[str, torch.Tensor],
                       lora: bool) -> None:
    """The checkpoints of the FSDP2 job (``two``) and of the single process that resumed it
    (``three``) hold what the single process (``one``) saved: full tensors of the same names
    within the tolerance, in the same format, with the full name-keyed optimizer state."""
    for run, step in [("two", 1), ("two", 2), ("two", 3), ("three", 3)]:
        # two 3: after a resume under FSDP2; three 3: after one process resumed it
        w1, w2 = _saved(runs["one"][step].path), _saved(runs[run][step].path)
        assert set(w2) == set(w1) == set(w0)
        assert all(w2[k].shape == w0[k].shape for k in w0)  # full tensors, not shards
        assert _dist(w1, w2) < 1e-3 * _dist(w1, w0), (run, step)
        assert (runs[run][step].path / "adapter_config.json").is_file() == lora
        assert (runs[run][step].path / "model.safetensors").is_file() != lora
    if lora:  # the same PEFT adapter configuration (rank, alpha, targets, base) as one's
        cfgs = [json.loads((runs[r][3].path / "adapter_config.json").read_text())
                for r in ("one", "two")]
        for c in cfgs:  # a set in PEFT, written in hash order
            c["target_modules"] = sorted(c["target_modules"])
        assert cfgs[0] == cfgs[1]
    state = torch.load(runs["two"][2].path / "trainer_state.pt", weights_only=False)
    assert state["optimizer_format"] == FULL_FORMAT
    trained = [n for n, p in one.policy.model.named_parameters() if p.requires_grad]
    assert set(state["optimizer"]["state"]) == set(trained)  # full state, keyed by name


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_torchrun_fsdp2_trains_pushes_and_resumes_like_one_process(lora, tiny_model_dir,
                                                                   redis_url, tmp_path):
    """A 2-rank FSDP2 job (full fine-tuning, or LoRA adapters on the sharded frozen base)
    trains, pushes and checkpoints what one process does, across a resume under FSDP2 and a
    resume of its checkpoint by one process; with LoRA also across an FSDP2 resume of one
    process's checkpoint."""
    client = redis.Redis.from_url(redis_url)
    sampler = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    groups = [sample_group(sampler, group_size=3, prompt_len=3, new_tokens=(2, 7), seed=k,
                           group_id=f"g{k}") for k in range(6)]
    _queue(client, "one", groups)
    _queue(client, "two", groups)
    common = dict(model=str(tiny_model_dir), redis_url=redis_url, groups_per_step=2,
                  minibatches=2, micro_batch_tokens=24, lr=1e-3, read_timeout_s=0.5,
                  device="cpu", console=False, save_every=1, keep_last=5,
                  loss={"kind": "gspo"}, old_logprobs="recompute",
                  **({"lora_rank": 4, "lora_alpha": 8.0} if lora else {}))
    assert _pad_passes(groups, common) > 0  # the uneven split is exercised
    one = Learner(LearnerConfig(**common, key_prefix="one", save_dir=str(tmp_path / "one"),
                                max_steps=3), client=client, sync=NoSync())
    one.run()
    _torchrun_two_ranks(common, tmp_path, ["--lora-rank", "4"] if lora else [])
    # world size 2 -> 1: one process resumes the FSDP2 checkpoint of step 2
    shutil.copytree(list_checkpoints(tmp_path / "two")[1].path,
                    tmp_path / "three" / "step-00000002")
    _queue(client, "three", groups[4:])
    Learner(LearnerConfig(**common, key_prefix="three", save_dir=str(tmp_path / "three"),
                          max_steps=3, resume=True), client=client, sync=NoSync()).run()

    runs = {p: {c.state.step: c for c in list_checkpoints(tmp_path / p)}
            for p in ("one", "two", "three")}
    assert sorted(runs["one"]) == sorted(runs["two"]) == [1, 2, 3] and 3 in runs["three"]
    assert runs["two"][3].state.groups_trained == runs["three"][3].state.groups_trained == 6
    w0 = _check_pushes(tmp_path, runs["two"], one)[0]  # the start-up push: the initial weights
    if not lora:  # plain HF names, the tied head not duplicated
        assert set(w0) == set(load_file(str(Path(tiny_model_dir) / "model.safetensors")))
    _check_checkpoints(runs, one, w0, lora)
    names = ["one", "two", "three"]
    if lora:  # and 1 -> 2: FSDP2 resumes one process's LoRA checkpoint
        four = _fsdp2_resumes_one(common, tmp_path, client, groups, runs["one"][2].path)
        assert four[3].state.groups_trained == 6
        w1, w4 = _saved(runs["one"][3].path), _saved(four[3].path)
        assert set(w4) == set(w1) and _dist(w1, w4) < 1e-3 * _dist(w1, w0)
        names.append("four")
    recs = {p: [x for x in map(json.loads, (tmp_path / p / "metrics.jsonl").read_text()
                               .splitlines()) if x.get("event") == "step"]
            for p in names}
    _check_metrics(recs, {"two": [2, 2, 2], "three": [1], **({"four": [2]} if lora else {})})
