"""Weights reach every rollout server over the broadcast, with exact log-probability parity.

A real server (hf engine, uvicorn on a free port, real Redis, registered by its heartbeat) and
the learner's ``BroadcastSync`` in the same test: the learner perturbs its weights, pushes them,
and the server's log-probabilities for fixed tokens must equal the learner's forward pass
within 1e-4 (float32, CPU), for tied and untied input/output embeddings.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
import redis
import torch
from transformers import AutoModelForCausalLM

from gspo_rl.contract.schema import Keys
from gspo_rl.learner.weights.broadcast import BroadcastSync
from gspo_rl.redisq.registry import ServerInfo, live_servers, register
from tests.conftest import free_port
from tests.helpers.reference_logprobs import sequence_logprobs
from tests.helpers.serving import ADMIN_KEY, API_KEY, running_server

PROMPT = [5, 17, 42, 99, 7, 300, 12]


def _wait_registered(client: redis.Redis, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while len(live_servers(client, Keys())) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n} servers did not register within {timeout}s")
        time.sleep(0.1)


def _perturb(model: torch.nn.Module, seed: int, only: str | None = None) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only is None or name == only:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)


def _server_sample(url: str, temperature: float, seed: int) -> dict:
    r = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "seed": seed,
                         "temperature": temperature, "logprobs": 1}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _assert_parity(model: torch.nn.Module, url: str, version: int) -> None:
    for temperature in (1.0, 0.7):
        choice = _server_sample(url, temperature, seed=int(temperature * 10))
        assert set(choice["policy_versions"]) == {version}
        ids = PROMPT + choice["token_ids"]
        ours = sequence_logprobs(model, ids, len(PROMPT), temperature)
        theirs = choice["logprobs"]["token_logprobs"]
        assert len(theirs) == len(ours)
        torch.testing.assert_close(torch.tensor(theirs), torch.tensor(ours), atol=1e-4, rtol=0)


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_model_untied_dir"])
def test_push_gives_exact_logprob_parity(fixture, request, redis_url):
    model_dir: Path = request.getfixturevalue(fixture)
    client = redis.Redis.from_url(redis_url)
    learner_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tied = learner_model.config.tie_word_embeddings
    with running_server(model_dir, redis_url) as served:
        _wait_registered(client, 1)
        sync = BroadcastSync(client, Keys(), admin_key=ADMIN_KEY, timeout_s=30,
                             bucket_bytes=256 * 1024)
        try:
            # Version 1: every parameter moves.
            _perturb(learner_model, seed=1)
            report = sync.push(learner_model, version=1)
            assert report.ok and report.servers == ["test-server"], report
            assert report.bytes_sent > 0 and report.rebuilt
            _assert_parity(learner_model, served.url, version=1)
            # Version 2: only the input embedding moves; with tied embeddings the output
            # layer must follow it on the server too (the stale-lm_head trap).
            _perturb(learner_model, seed=2, only="model.embed_tokens.weight")
            report = sync.push(learner_model, version=2)
            assert report.ok and not report.rebuilt  # same members: the group is reused
            _assert_parity(learner_model, served.url, version=2)
            if tied:
                assert learner_model.lm_head.weight is learner_model.model.embed_tokens.weight
            health = httpx.get(f"{served.url}/health").json()
            assert health["policy_version"] == 2
        finally:
            sync.close()


def test_dead_server_is_dropped_and_the_live_one_still_updates(tiny_model_dir, redis_url):
    client = redis.Redis.from_url(redis_url)
    learner_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    keys = Keys()
    with running_server(tiny_model_dir, redis_url) as served:
        _wait_registered(client, 1)
        # A registered server with a fresh heartbeat that never answers (nothing listens).
        ghost = ServerInfo(server_id="ghost", url=f"http://127.0.0.1:{free_port()}",
                           engine="hf", model="tiny")
        register(client, keys, ghost, ADMIN_KEY, ttl_s=60)  # it held the key, then died
        sync = BroadcastSync(client, keys, admin_key=ADMIN_KEY, timeout_s=5)
        try:
            _perturb(learner_model, seed=3)
            report = sync.push(learner_model, version=1)
            assert report.ok, report
            assert report.dropped == ["ghost"]
            assert report.servers == ["test-server"]
            _assert_parity(learner_model, served.url, version=1)
        finally:
            sync.close()


def test_push_with_no_servers_is_a_no_op(redis_url, tiny_model_dir):
    client = redis.Redis.from_url(redis_url)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    sync = BroadcastSync(client, Keys(), admin_key=ADMIN_KEY, timeout_s=5)
    try:
        report = sync.push(model, version=1)
        assert report.ok and report.servers == [] and report.bytes_sent == 0
    finally:
        sync.close()


def test_admin_routes_refuse_the_api_key(tiny_model_dir, redis_url):
    with running_server(tiny_model_dir, redis_url) as served:
        for key in (API_KEY, None, "wrong"):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            r = httpx.post(f"{served.url}/admin/pause", headers=headers)
            assert r.status_code == 401, r.text
            assert "error" in r.json()
        r = httpx.post(f"{served.url}/admin/weights/update",
                       headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                       json={"epoch": 0, "version": 1, "tensors": []})
        assert r.status_code == 422  # at least one tensor


def _join(url: str, port: int, epoch: int, timeout_s: float) -> httpx.Response:
    return httpx.post(f"{url}/admin/weights/join",
                      headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                      json={"master_addr": "127.0.0.1", "master_port": port, "rank": 1,
                            "world_size": 2, "epoch": epoch, "timeout_s": timeout_s},
                      timeout=60)


def _assert_reasoned_504(r: httpx.Response, epoch: int) -> None:
    assert r.status_code == 504, r.text
    error = r.json()["error"]
    assert error["type"] == "weight_sync_error"
    head = f"could not join weight group epoch {epoch}: "
    assert error["message"].startswith(head) and len(error["message"]) > len(head) + 10, error


def test_a_join_whose_group_never_forms_says_why(tiny_model_dir, redis_url):
    """The learner hosts the store and never joins: 504 with gloo's reason. And where the
    group's set-up outlasts the route's own wait (compose: the learner's connects to an
    address it could not reach were retried past it; that cannot be set up on one machine,
    so the engine's join is made to take that long) the 504 says what did not form instead
    of ending in an empty reason, as it did."""
    from gspo_rl.contract.weights.collective import JoinRequest, host_store

    port = free_port()
    store = host_store("127.0.0.1", port, timeout_s=10)
    with running_server(tiny_model_dir, redis_url) as served:
        _assert_reasoned_504(_join(served.url, port, epoch=7, timeout_s=2), epoch=7)
        engine = served.app.state.engine

        async def outlasts(req: JoinRequest) -> None:
            await asyncio.sleep(req.timeout_s + 30)

        engine.join_weight_group = outlasts
        r = _join(served.url, port, epoch=8, timeout_s=0.5)
    del store
    _assert_reasoned_504(r, epoch=8)
    assert "did not form within 0.5 s" in r.json()["error"]["message"]


def test_lora_push_sends_only_the_adapter_and_servers_match_after_several(tiny_model_dir,
                                                                            redis_url):
    """A PEFT-wrapped learner pushes adapter tensors only (gloo); the hf engine merges them
    into its copy of the base and samples with the learner's log-probabilities, update after
    update (each merged from W0, never into the previous merge)."""
    from peft import LoraConfig, get_peft_model

    client = redis.Redis.from_url(redis_url)
    learner_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    full_bytes = sum(p.numel() * p.element_size() for p in learner_model.parameters())
    get_peft_model(learner_model, LoraConfig(r=4, lora_alpha=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    with running_server(tiny_model_dir, redis_url) as served:
        _wait_registered(client, 1)
        sync = BroadcastSync(client, Keys(), admin_key=ADMIN_KEY, timeout_s=30)
        try:
            for version in (1, 2, 3):
                g = torch.Generator().manual_seed(version)
                with torch.no_grad():
                    for p in learner_model.parameters():
                        if p.requires_grad:  # the adapters only: the base stays frozen
                            p.add_(torch.randn(p.shape, generator=g) * 0.05)
                report = sync.push(learner_model, version=version)
                assert report.ok and report.lora, report
                assert 0 < report.bytes_sent < full_bytes / 10
                _assert_parity(learner_model, served.url, version=version)
        finally:
            sync.close()
