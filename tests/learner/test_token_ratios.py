"""Each trained rollout's per-token log importance ratio, log(pi_prox / pi_behavior), written
by the learner after its step (``Keys.token_ratios``; the dashboard's shading). A real learner
on the tiny model trains groups from a real Redis's ready stream whose behaviour log-probs
were shifted by known random amounts; the ratios it writes must equal the model's own
log-probabilities at the step's start weights (recomputed here with a plain forward) minus
those behaviour log-probs, one per sampled token, with a TTL; in both ways pi_prox is taken
(the update's own forward, and a pass before several minibatches), over several microbatches,
packed (several rollouts in one row of the forward) and padded.
"""

from __future__ import annotations

import numpy as np
import pytest
import redis
import torch
from transformers import AutoModelForCausalLM

from gspo_rl.contract.ratios import unpack_log_ratios
from gspo_rl.contract.schema import READY_STREAM_FIELD, Keys, ReadyGroup, pack_ready_group
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.loop import Learner
from gspo_rl.learner.runtime.published import publish_token_ratios, ratios_ttl_s
from gspo_rl.learner.tracking.metrics import trained_history
from gspo_rl.learner.weights.base import NoSync
from tests.helpers.learner_data import sample_group
from tests.helpers.reference_logprobs import sequence_logprobs

KEYS = Keys()


def shifted_groups(model: torch.nn.Module, n: int) -> list[ReadyGroup]:
    """Sampled groups whose behaviour log-probs are shifted by a random amount per token (a
    sampler that disagrees with the learner), so the ratios are far from 1."""
    rng = np.random.default_rng(0)
    groups = [sample_group(model, group_size=3, prompt_len=3, new_tokens=(2, 6), seed=k,
                           group_id=f"g{k}") for k in range(n)]
    for g in groups:
        for r in g.rollouts:
            sampled = r.loss_mask > 0
            r.logprobs = r.logprobs.copy()
            r.logprobs[sampled] += rng.uniform(-0.6, 0.6, int(sampled.sum())).astype(np.float32)
    return groups


def expected_log_ratios(model: torch.nn.Module, g: ReadyGroup) -> dict[str, np.ndarray]:
    """log pi(token) at ``model``'s weights minus the behaviour log-prob, per sampled token."""
    out = {}
    for r in g.rollouts:
        lp = np.asarray(sequence_logprobs(model, r.token_ids.tolist(), r.prompt_len,
                                          r.temperature))
        out[r.rollout_id] = lp - r.logprobs[r.prompt_len:]
    return out


def train_one_step(tiny_model_dir, client: redis.Redis, redis_url: str, tmp_path,
                   groups: list[ReadyGroup], **fields) -> Learner:
    for g in groups:
        client.xadd(KEYS.ready_stream, {READY_STREAM_FIELD: pack_ready_group(g)})
    cfg = LearnerConfig(model=str(tiny_model_dir), redis_url=redis_url,
                        groups_per_step=len(groups), micro_batch_tokens=20, max_steps=1,
                        save_dir=str(tmp_path / "ck"), read_timeout_s=0.5, console=False,
                        device="cpu", **fields)
    learner = Learner(cfg, client=client, sync=NoSync())
    learner.run()
    return learner


@pytest.mark.parametrize(("minibatches", "packing"), [(1, "on"), (2, "off")],
                         ids=["own-forward-packed", "separate-pass-padded"])
def test_the_learner_writes_each_trained_rollouts_ratios(tiny_model_dir, redis_url, tmp_path,
                                                         minibatches, packing) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    groups = shifted_groups(model, 3)
    client = redis.Redis.from_url(redis_url)
    learner = train_one_step(tiny_model_dir, client, redis_url, tmp_path, groups,
                             minibatches=minibatches, packing=packing,
                             old_logprobs="recompute")
    assert learner.trainer.policy.packing == (packing == "on")
    (step,) = trained_history(tmp_path / "ck" / "metrics.jsonl")
    ttl = ratios_ttl_s(learner.config)
    assert ttl >= learner.config.keep_trained_s > 0
    row_means = []
    for g in groups:
        for rid, want in expected_log_ratios(model, g).items():
            blob = client.get(KEYS.token_ratios(rid))
            assert blob is not None, rid
            got = unpack_log_ratios(blob)
            assert got.shape == want.shape  # one per sampled token
            assert np.abs(want).max() > 0.05  # far from ratio 1: the shift shows
            np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)
            assert 0 < client.ttl(KEYS.token_ratios(rid)) <= ttl
            row_means.append(abs(float(got.astype(np.float64).mean())))
    # The step's own figure: the mean over rollouts of |mean log-ratio|.
    assert np.mean(row_means) == pytest.approx(step["prox_behavior_abs_log_ratio"], rel=1e-2)
    client.close()


def test_none_are_written_when_switched_off_or_without_pi_prox(tiny_model_dir, redis_url,
                                                               tmp_path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    client = redis.Redis.from_url(redis_url)
    for k, fields in enumerate([{"token_ratios": False, "old_logprobs": "recompute"},
                                {"old_logprobs": "behavior"}]):
        groups = shifted_groups(model, 1)
        learner = train_one_step(tiny_model_dir, client, redis_url, tmp_path / str(k), groups,
                                 **fields)
        assert learner.step == 1
        assert learner.trainer.log_ratios == {}
        assert client.exists(*[KEYS.token_ratios(r.rollout_id) for r in groups[0].rollouts]) == 0
    client.close()


def test_a_redis_error_is_logged_not_raised(caplog) -> None:
    gone = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    publish_token_ratios(gone, KEYS, {"r0": np.zeros(3, dtype=np.float16)}, 60)
    assert "importance ratios of 1 rollouts failed" in caplog.text
