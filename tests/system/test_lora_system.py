"""LoRA end to end with real parts (hf engine under uvicorn, Redis, the learner loop): multi-
turn episodes are played, the learner trains adapters with GSPO-token, pushes only the adapter
after every step and checkpoints it; the server's log-probabilities of a new multi-turn episode
then equal the learner's (float32, 1e-4, the full fine-tuning tolerance), every step record
says how many bytes were pushed, and a learner resumed from the LoRA checkpoint starts from
the same adapter: its start-up push leaves the server on exactly its function (that it then
trains on exactly: tests/learner/model/test_lora.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import redis
import torch

from gspo_rl.contract.schema import Keys
from gspo_rl.learner.algorithm.config import LossConfig
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.loop import Learner
from gspo_rl.redisq.groups.store import QueueConfig
from gspo_rl.redisq.registry import live_servers
from tests.conftest import wait_until
from tests.helpers.queue import stored_rollout
from tests.helpers.serving import ADMIN_KEY, running_server
from tests.system.test_multiturn import play_group

KEYS = Keys()
pytestmark = pytest.mark.slow  # ~35 s on a loaded 2-core box


def _assert_episode_parity(learner: Learner, client: redis.Redis, group_id: str,
                           version: int) -> None:
    """Every sampled token of the group's episodes: the server's log-prob is the learner's."""
    rids = client.lrange(KEYS.group_rollouts(group_id), 0, -1)
    assert len(rids) == 2
    for rid in rids:
        rec = stored_rollout(client, rid.decode())
        assert rec is not None
        mask = torch.from_numpy(rec.loss_mask.astype(np.float32))[None]
        assert len(rec.turns) >= 2 and set(rec.versions[rec.loss_mask > 0]) == {version}
        ids = torch.from_numpy(rec.token_ids.astype(np.int64))[None]
        with torch.no_grad():
            ours = learner.policy.token_logprobs(ids, torch.ones_like(ids),
                                                 torch.tensor([rec.temperature]), mask)[0]
        keep = rec.loss_mask > 0
        torch.testing.assert_close(ours[keep], torch.from_numpy(rec.logprobs[keep]),
                                   atol=1e-4, rtol=0)


def test_lora_learner_and_hf_server_stay_exact_over_multi_turn_steps_and_resume(
        tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    with running_server(tiny_model_dir, redis_url,
                        queue=QueueConfig(drop_zero_variance=False)) as served:
        wait_until(lambda: len(live_servers(client, KEYS)) == 1, "server registered")
        for k in range(3):
            play_group(served, [2, 3], [0.0, 1.0], [None, None], seed=k)
        wait_until(lambda: client.xlen(KEYS.ready_stream) == 3, "3 ready groups")
        cfg = dict(model=str(tiny_model_dir), redis_url=redis_url, groups_per_step=1,
                   max_steps=3, lr=2e-2, read_timeout_s=0.5, console=False,
                   loss=LossConfig(kind="gspo_token"), lora_rank=4, lora_alpha=8.0,
                   save_dir=str(tmp_path / "ck"), save_every=2, weight_sync="broadcast",
                   admin_key=ADMIN_KEY, sync_timeout_s=30)
        learner = Learner(LearnerConfig(**cfg), client=client)
        state = learner.run()
        assert (state.step, state.version) == (3, 3)
        records = [json.loads(line) for line in
                   (tmp_path / "ck" / "metrics.jsonl").read_text().splitlines()]
        start = next(r for r in records if r["event"] == "start")
        assert 0 < start["trainable_params"] < start["total_params"] / 10
        steps = [r for r in records if r["event"] == "step"]
        assert len(steps) == 3 and all(s["sync_ok"] for s in steps)
        full = sum(p.numel() * 4 for p in learner.policy.model.parameters())
        assert all(0 < s["sync_bytes"] < full / 10 for s in steps)
        assert (tmp_path / "ck" / "step-00000003" / "adapter_model.safetensors").is_file()
        # a new multi-turn episode, sampled from the pushed adapter: the learner's function
        _assert_episode_parity(learner, client, play_group(served, [2, 2], [0.0, 1.0],
                                                           [None, None], seed=7), version=3)

        # resume: the same adapter and optimizer; its start-up push (of version 3, which it
        # published) leaves the server on exactly its function
        resumed = Learner(LearnerConfig(**{**cfg, "resume": True, "max_steps": 4}),
                          client=client)
        assert resumed.step == 3 and resumed.version == 3 and resumed._last_sync_ok
        for a, b in zip(learner.trainer.params, resumed.trainer.params, strict=True):
            assert torch.equal(a, b)
        _assert_episode_parity(resumed, client, play_group(served, [2, 2], [0.0, 1.0],
                                                           [None, None], seed=8), version=3)
        resumed.sync.close()
