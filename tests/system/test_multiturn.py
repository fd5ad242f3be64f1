"""Multi-turn episodes on the learner side, with real trajectories from a real server and Redis.

- GSPO-token on real episodes: per-token advantages are 0 on every token the model did not
  write, its gradients are exactly 0 there, and with one advantage per episode (no turn
  rewards) its parameter gradients equal GSPO's; with turn rewards each turn gets the credit
  rule's own advantage.
- The calculator example (``clients/examples/calculator.py``) runs end to end through the
  ``openai`` client against a server, and ``run_learner`` with ``gspo_token`` trains on exactly
  those trajectories.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import redis
import torch

from gspo_rl.client.client import AsyncGSPOClient, GSPOClient
from gspo_rl.client.examples.calculator import CalculatorEnvironment
from gspo_rl.client.runner import arun_groups
from gspo_rl.contract.credit import group_turn_advantages
from gspo_rl.contract.schema import Keys, ReadyGroup, unpack_rollout
from gspo_rl.learner.algorithm.advantages import TurnAdvantages, advantage_fn_for
from gspo_rl.learner.algorithm.config import LossConfig
from gspo_rl.learner.algorithm.losses import group_advantages, policy_loss
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.data.batching import plan_step, sequence_advantage
from gspo_rl.learner.model.policy import Policy
from gspo_rl.learner.run import run_learner
from gspo_rl.learner.trainer import Trainer
from gspo_rl.redisq.groups.store import QueueConfig
from tests.helpers.queue import ready_groups as ready_groups_of
from tests.helpers.serving import API_KEY, MODEL_NAME, Served, running_server

KEYS = Keys()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(tiny_model_dir: Path, redis_url: str) -> Iterator[Served]:
    with running_server(tiny_model_dir, redis_url,
                        queue=QueueConfig(drop_zero_variance=False)) as s:
        yield s


def play_group(served: Served, turns: list[int], rewards: list[float],
               turn_rewards: list[list[float] | None], seed: int) -> str:
    """A group of episodes with the given numbers of model turns, rewarded as given."""
    client = openai.OpenAI(base_url=served.v1, api_key=API_KEY, max_retries=0, timeout=60)
    with GSPOClient(served.url, api_key=API_KEY) as sdk:
        g = sdk.open_group(len(turns))
        for i, (rid, n) in enumerate(zip(g["rollout_ids"], turns, strict=True)):
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {seed}"}]
            for k in range(n):
                c = client.chat.completions.create(
                    model=MODEL_NAME, messages=messages, max_tokens=6, seed=seed * 100 + i * 10
                    + k, extra_body={"rollout_id": rid}).choices[0]
                messages += [{"role": "assistant", "content": c.message.content},
                             {"role": "tool", "content": f"result {k}"}]
        sdk.post_rewards([{"rollout_id": rid, "reward": w, "turn_rewards": tr}
                          for rid, w, tr in zip(g["rollout_ids"], rewards, turn_rewards,
                                                strict=True)])
    return g["group_id"]


def ready_groups(redis_url: str) -> dict[str, ReadyGroup]:
    r = redis.Redis.from_url(redis_url)
    try:
        groups = ready_groups_of(r, KEYS)
    finally:
        r.close()
    return {g.group_id: g for g in groups}


def param_grads(policy: Policy, groups: list[ReadyGroup], kind: str,
                advantage_fn: Any) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """One loss over the groups (one microbatch): parameter gradients, the gradient with
    respect to the token log-probabilities, and the mask."""
    plan = plan_step(groups, 1, 10**9, advantage_fn)
    (micro,) = plan.minibatches[0].micro
    policy.model.zero_grad(set_to_none=True)
    lp = policy.token_logprobs(micro.tokens_BT, micro.attention_BT, micro.temperature_B,
                               micro.mask_BT)
    lp.retain_grad()
    out = policy_loss(lp, micro.behavior_BT, micro.advantages, micro.mask_BT,
                      LossConfig(kind=kind))
    out.loss.backward()
    grads = [p.grad.detach().clone() for p in policy.model.parameters() if p.grad is not None]
    assert lp.grad is not None
    return grads, lp.grad.detach().clone(), micro.mask_BT


def test_gspo_token_on_real_episodes(served: Served, redis_url: str,
                                     tiny_model_dir: Path) -> None:
    flat = play_group(served, [2, 3, 1], [1.0, 0.0, 0.5], [None, None, None], seed=1)
    credit = play_group(served, [2, 2, 1], [0.0, 1.0, 0.0], [[0.5, 0.0], None, [0.25]],
                        seed=2)
    groups = ready_groups(redis_url)
    g_flat, g_credit = groups[flat], groups[credit]
    assert [len(r.turns) for r in g_flat.rollouts] == [2, 3, 1]

    # Per-token advantages: the episode's advantage on its model turns, 0 everywhere else.
    fn = TurnAdvantages()
    for i, r in enumerate(g_flat.rollouts):
        adv = fn(g_flat, i)
        mask = r.loss_mask.astype(bool)
        assert np.all(adv[~mask] == 0)
        np.testing.assert_allclose(adv[mask], g_flat.advantages[i], rtol=1e-6)
    expected = group_turn_advantages(g_credit.rewards, g_credit.turn_rewards,
                                     [len(r.turns) for r in g_credit.rollouts])
    for i, r in enumerate(g_credit.rollouts):
        adv = fn(g_credit, i)
        for (a, b), want in zip(r.turns, expected[i], strict=True):
            np.testing.assert_allclose(adv[a:b], want, rtol=1e-6)
        assert np.all(adv[~r.loss_mask.astype(bool)] == 0)
    assert expected[0][0] != expected[0][1]  # turn rewards give the turns different credit
    # The published per-turn advantages are the ones the learner spreads; a group without
    # them (an older record) is recomputed, and a turn-reward count that does not match is
    # refused: the learner drops such a group as invalid instead of guessing.
    assert [len(t) for t in g_credit.turn_advantages] == [2, 2, 1]
    with pytest.raises(ValueError, match="turn rewards"):
        TurnAdvantages()(dataclasses.replace(g_credit, turn_rewards=[[1.0], None, None],
                                             turn_advantages=[]), 0)

    # The trainer picks per-token credit for gspo_token, sequence advantages for gspo.
    policy = Policy.load(tiny_model_dir, "cpu", False, False)
    cfg = LearnerConfig(model=str(tiny_model_dir), loss=LossConfig(kind="gspo_token"))
    assert isinstance(Trainer(policy, cfg).advantage_fn, TurnAdvantages)
    gspo_cfg = cfg.model_copy(update={"loss": LossConfig(kind="gspo")})
    assert Trainer(policy, gspo_cfg).advantage_fn is sequence_advantage

    tok_grads, lp_grad, mask = param_grads(policy, [g_flat], "gspo_token", TurnAdvantages())
    assert torch.all(lp_grad[mask == 0] == 0) and lp_grad[mask == 1].abs().sum() > 0
    seq_grads, seq_lp_grad, _ = param_grads(policy, [g_flat], "gspo", sequence_advantage)
    torch.testing.assert_close(lp_grad, seq_lp_grad, rtol=1e-6, atol=1e-9)
    for a, b in zip(tok_grads, seq_grads, strict=True):  # float32 roundoff through backward
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * float(b.abs().max()))

    tok_grads, lp_grad, mask = param_grads(policy, [g_credit], "gspo_token", TurnAdvantages())
    assert torch.all(lp_grad[mask == 0] == 0)
    seq_grads, _, _ = param_grads(policy, [g_credit], "gspo", sequence_advantage)
    assert any(not torch.allclose(a, b) for a, b in zip(tok_grads, seq_grads, strict=True))


def test_gspo_uses_the_turn_rewards_gspo_token_uses(served: Served, redis_url: str,
                                                    tiny_model_dir: Path) -> None:
    # Turn rewards that give every model token of an episode the same advantage: one turn per
    # episode, or rewards only on the last of equally many turns. GSPO-token must then equal
    # GSPO in value and gradient, on data that went server -> Redis -> learner; GSPO used to
    # take its advantages from the final rewards alone.
    one = play_group(served, [1, 1, 1], [1.0, 1.0, 0.0], [[0.5], [0.0], [0.25]], seed=3)
    last = play_group(served, [2, 2, 2], [1.0, 1.0, 0.0], [[0.0, 0.5], [0.0, 0.0],
                                                             [0.0, 0.25]], seed=4)
    groups = ready_groups(redis_url)
    policy = Policy.load(tiny_model_dir, "cpu", False, False)
    for gid in (one, last):
        g = groups[gid]
        totals = [w + sum(tr) for w, tr in zip(g.rewards, g.turn_rewards, strict=True)]
        np.testing.assert_allclose(g.advantages, group_advantages(totals).numpy(), rtol=1e-5)
        tok = param_grads(policy, [g], "gspo_token", advantage_fn_for("gspo_token"))
        seq = param_grads(policy, [g], "gspo", advantage_fn_for("gspo"))
        torch.testing.assert_close(tok[1], seq[1], rtol=1e-6, atol=1e-9)
        for a, b in zip(tok[0], seq[0], strict=True):  # float32 roundoff through backward
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * float(b.abs().max()))


def test_calculator_example_end_to_end_with_learner(served: Served, redis_url: str,
                                                    tiny_model_dir: Path,
                                                    tmp_path: Path) -> None:
    env = CalculatorEnvironment(group_size=2, max_turns=3, max_tokens=16)

    async def play() -> list[Any]:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await arun_groups(env, client, 2, concurrency=2, seed=3)

    outcomes = asyncio.run(play())
    assert len(outcomes) == 2
    r = redis.Redis.from_url(redis_url)
    trained_tokens = 0
    for o in outcomes:
        assert r.hget(KEYS.group(o.group_id), "state") == b"published"
        for rid, tr in zip(o.rollout_ids, o.turn_rewards, strict=True):
            rec = unpack_rollout(r.get(KEYS.rollout(rid)))
            assert tr is not None and 1 <= len(tr) <= 3 and len(rec.turns) == len(tr)
            assert int(rec.loss_mask.sum()) == sum(b - a for a, b in rec.turns)
            trained_tokens += int(rec.loss_mask.sum())
    r.close()

    metrics = tmp_path / "metrics.jsonl"
    cfg = LearnerConfig(model=str(tiny_model_dir), redis_url=redis_url,
                        loss=LossConfig(kind="gspo_token"), groups_per_step=2, max_steps=1,
                        read_timeout_s=2.0, console=False, metrics_jsonl=str(metrics))
    state = run_learner(cfg)
    assert state is not None and state.step == 1
    (step,) = [rec for rec in map(json.loads, metrics.read_text().splitlines())
               if rec.get("event") == "step"]
    assert sorted(step["group_ids"]) == sorted(o.group_id for o in outcomes)
    assert step["rollouts"] == 4 and step["trained_tokens"] == trained_tokens


def test_sdk_imports_without_torch() -> None:
    code = ("import sys, clients, gspo_rl.client.environment, gspo_rl.client.client; "
            "heavy = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
