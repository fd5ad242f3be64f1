"""Data-parallel learner: work split units, and a real 2-rank torchrun (gloo) job that must
train the same weights as one process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import redis
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from gspo_rl.contract.ratios import unpack_log_ratios
from gspo_rl.contract.schema import (
    LEARNER_CONSUMER_GROUP,
    READY_STREAM_FIELD,
    Keys,
    pack_ready_group,
)
from gspo_rl.learner.checkpoint.store import load_latest
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.data.batching import samples_from_groups, split_micro
from gspo_rl.learner.loop import Learner
from gspo_rl.learner.model.policy import Policy
from gspo_rl.learner.parallel.distributed import assign_owners
from gspo_rl.learner.startup import seed_everything
from gspo_rl.learner.weights.adapter import lora_payload
from gspo_rl.learner.weights.base import NoSync
from tests.helpers.learner_data import sample_group


def test_assign_owners_balances_and_covers_every_item():
    costs = [90, 10, 40, 40, 30, 30, 5]
    owners = assign_owners(costs, 2)
    loads = [sum(c for c, o in zip(costs, owners, strict=True) if o == r) for r in (0, 1)]
    assert sorted(loads) == [120, 125]
    assert assign_owners([5], 4) == [0] and assign_owners([], 3) == []


def test_split_micro_makes_one_part_per_rank_when_it_can(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    samples = samples_from_groups([sample_group(model, group_size=5, seed=1)])
    assert len(split_micro(samples, 10_000)) == 1
    assert len(split_micro(samples, 10_000, min_parts=3)) >= 3
    assert len(split_micro(samples, 10_000, min_parts=50)) == 5  # one per rollout at most


def _weights(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's trained tensors: the model, or a LoRA checkpoint's adapter (named as a
    push names them)."""
    adapter = ckpt_dir / "adapter_model.safetensors"
    if adapter.is_file():
        return {k.removeprefix("base_model.model."): v for k, v in load_file(adapter).items()}
    return load_file(str(ckpt_dir / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_torchrun_two_ranks_trains_what_one_process_trains(lora, tiny_model_dir, redis_url,
                                                           tmp_path):
    """Every rank's replica starts from the same weights (fresh LoRA adapters are random: each
    rank draws the same ones) and takes the same update as one process; rank 0 writes every
    rank's rollouts' importance ratios, the ones one process writes."""
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    client = redis.Redis.from_url(redis_url)
    sampler = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    groups = [sample_group(sampler, group_size=3, prompt_len=3, new_tokens=(2, 7), seed=k,
                           group_id=f"g{k}") for k in range(4)]
    for prefix in ("one", "two"):  # the same stream under two prefixes
        for g in groups:
            client.xadd(Keys(prefix).ready_stream, {READY_STREAM_FIELD: pack_ready_group(g)})
    common = dict(model=str(tiny_model_dir), redis_url=redis_url, groups_per_step=2,
                  minibatches=2, micro_batch_tokens=24, max_steps=2, lr=1e-3,
                  read_timeout_s=0.5, device="cpu", console=False,
                  loss={"kind": "gspo"}, old_logprobs="recompute",
                  **({"lora_rank": 4, "lora_alpha": 8.0} if lora else {}))
    first = Learner(LearnerConfig(**common, key_prefix="one", save_dir=str(tmp_path / "one")),
                    client=client, sync=NoSync())
    first.run()

    toml = tmp_path / "two.toml"
    fields = {**common, "key_prefix": "two", "save_dir": str(tmp_path / "two")}
    loss = fields.pop("loss")
    toml.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in fields.items())
                    + f'\n[loss]\nkind = "{loss["kind"]}"\n')
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "gspo_rl.cli",
                        "learn", "--config", str(toml)], capture_output=True, text=True,
                       env=env, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    one, two = load_latest(tmp_path / "one"), load_latest(tmp_path / "two")
    assert one is not None and two is not None
    assert (one.state.step, one.state.groups_trained) == (two.state.step,
                                                          two.state.groups_trained) == (2, 4)
    w1, w2 = _weights(one.path), _weights(two.path)
    if lora:  # the start: the fresh adapters a learner seeded so draws
        seed_everything(first.config.seed)
        start = lora_payload(Policy.load(tiny_model_dir, "cpu", lora=first.config).model)
        assert start is not None
        w0 = dict(start[0])
    else:
        w0 = _weights(Path(tiny_model_dir))
    moved = sum(float((w1[k] - w0[k]).norm() ** 2) for k in w1) ** 0.5
    apart = sum(float((w1[k] - w2[k]).norm() ** 2) for k in w1) ** 0.5
    assert moved > 0.1
    assert apart < 1e-3 * moved  # same update, up to the order of float additions
    recs = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [x["ranks"] for x in recs if x.get("event") == "step"] == [2, 2]
    pend = client.xpending(Keys("two").ready_stream, LEARNER_CONSUMER_GROUP)
    assert int(pend["pending"]) == 0
    for r in (r for g in groups for r in g.rollouts):
        a, b = (client.get(Keys(p).token_ratios(r.rollout_id)) for p in ("one", "two"))
        assert a is not None and b is not None, r.rollout_id
        np.testing.assert_allclose(unpack_log_ratios(b), unpack_log_ratios(a), atol=5e-3)
