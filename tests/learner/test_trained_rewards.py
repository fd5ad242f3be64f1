"""The reward of what the learner trained, in its state hash (``TrainedRewards``): after each
step, the mean reward per sample of the groups that step trained (the step record's
``reward_trained``) and of its last steps' groups, which the dashboard shows beside the
sampled reward. A real learner on the tiny model, real groups on a real Redis's ready stream.
"""

from __future__ import annotations

import numpy as np
import pytest
import redis
import torch
from transformers import AutoModelForCausalLM

from gspo_rl.contract.schema import (
    READY_STREAM_FIELD,
    REWARD_TRAINED,
    REWARD_TRAINED_RECENT,
    REWARD_TRAINED_STEPS,
    Keys,
    ReadyGroup,
    pack_ready_group,
)
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.loop import Learner
from gspo_rl.learner.runtime.published import TrainedRewards
from gspo_rl.learner.tracking.metrics import trained_history
from gspo_rl.learner.weights.base import NoSync
from tests.helpers.learner_data import sample_group

KEYS = Keys()


def mean_reward(groups: list[ReadyGroup]) -> float:
    return float(np.concatenate([np.asarray(g.rewards, dtype=np.float64) for g in groups]).mean())


def test_the_state_hash_says_what_the_last_steps_trained(tiny_model_dir, redis_url,
                                                         tmp_path) -> None:
    sampler = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    client = redis.Redis.from_url(redis_url)
    groups = [sample_group(sampler, group_size=2, prompt_len=3, new_tokens=(2, 4), seed=k,
                           group_id=f"g{k}") for k in range(6)]
    for g in groups:
        client.xadd(KEYS.ready_stream, {READY_STREAM_FIELD: pack_ready_group(g)})
    cfg = LearnerConfig(model=str(tiny_model_dir), redis_url=redis_url, groups_per_step=2,
                        save_dir=str(tmp_path / "ck"), read_timeout_s=0.5, max_steps=3,
                        console=False)
    learner = Learner(cfg, client=client, sync=NoSync())
    assert REWARD_TRAINED.encode() not in client.hgetall(KEYS.learner_state)  # no step yet
    learner.run()
    steps = trained_history(tmp_path / "ck" / "metrics.jsonl")
    trained = {g.group_id: g for g in groups}
    last = [trained[gid] for gid in steps[-1]["group_ids"]]
    st = {k.decode(): v.decode() for k, v in client.hgetall(KEYS.learner_state).items()}
    assert st["step"] == "3"
    assert float(st[REWARD_TRAINED]) == pytest.approx(mean_reward(last))
    assert float(st[REWARD_TRAINED]) == pytest.approx(steps[-1]["reward_trained"])
    assert float(st[REWARD_TRAINED_RECENT]) == pytest.approx(mean_reward(groups))
    assert st[REWARD_TRAINED_STEPS] == "3"
    client.close()


def test_the_recent_mean_covers_the_last_steps_only(tiny_model_dir) -> None:
    sampler = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    groups = [sample_group(sampler, group_size=3, prompt_len=3, new_tokens=(2, 3), seed=k)
              for k in range(3)]
    rewards = TrainedRewards(steps=2)
    assert rewards.fields() == {}
    for g in groups:
        rewards.add([g])
    rewards.add([])  # a step without rewards (none to count) leaves the window as it is
    fields = rewards.fields()
    assert float(fields[REWARD_TRAINED]) == pytest.approx(mean_reward(groups[2:]))
    assert float(fields[REWARD_TRAINED_RECENT]) == pytest.approx(mean_reward(groups[1:]))
    assert fields[REWARD_TRAINED_STEPS] == 2
