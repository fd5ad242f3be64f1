"""The whole loop with real parts: rollout server (hf engine, uvicorn, Redis) -> environment
SDK samples and rewards groups -> learner trains them and broadcasts its weights -> the server
samples with exactly the learner's new policy."""

from __future__ import annotations

import httpx
import redis
import torch

from gspo_rl.client.client import GSPOClient
from gspo_rl.contract.schema import Keys
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.loop import Learner
from gspo_rl.redisq.registry import live_servers
from tests.conftest import wait_until
from tests.helpers.serving import ADMIN_KEY, API_KEY, running_server


def test_server_learner_round_trip_with_weight_broadcast(tiny_model_dir, redis_url, tmp_path):
    client = redis.Redis.from_url(redis_url)
    keys = Keys()
    with running_server(tiny_model_dir, redis_url) as served, \
            GSPOClient(served.url, api_key=API_KEY) as env:
        wait_until(lambda: len(live_servers(client, keys)) == 1, "server registered")
        for k in range(3):
            group = env.rollouts(prompt=f"hello world {k}", n=4, max_tokens=8,
                                 temperature=1.0, seed=k)
            env.post_rewards([{"rollout_id": r.rollout_id, "reward": float(i)}
                              for i, r in enumerate(group.rollouts)])
        wait_until(lambda: client.xlen(keys.ready_stream) == 3, "3 ready groups")

        cfg = LearnerConfig(model=str(tiny_model_dir), redis_url=redis_url, groups_per_step=1,
                            max_steps=3, lr=1e-3, read_timeout_s=0.5, console=False,
                            save_dir=str(tmp_path / "ck"), save_every=2,
                            weight_sync="broadcast", admin_key=ADMIN_KEY, sync_timeout_s=30)
        learner = Learner(cfg, client=client)
        state = learner.run()
        assert (state.step, state.version) == (3, 3)
        assert httpx.get(f"{served.url}/health").json()["policy_version"] == 3

        # The server now samples from the learner's weights: same log-probabilities.
        after = env.rollouts(prompt="hello world", n=2, max_tokens=10, temperature=0.7, seed=9)
        policy = learner.policy
        for r in after.rollouts:
            assert r.policy_version == 3
            ids = torch.tensor([after.prompt_token_ids + r.token_ids])
            mask = torch.zeros_like(ids, dtype=torch.float32)
            mask[0, len(after.prompt_token_ids):] = 1
            with torch.no_grad():
                lp = policy.token_logprobs(ids, torch.ones_like(ids), torch.tensor([0.7]), mask)
            ours = lp[0, len(after.prompt_token_ids):]
            torch.testing.assert_close(ours.cpu(), torch.tensor(r.logprobs), atol=1e-4, rtol=0)
