"""A client that leaves mid-generation: its generation is aborted and nothing is recorded
(issue 11: a 64 x 2000-token request decoded 3.5 minutes after its client left, then recorded
an orphan group). Real uvicorn, real Redis, the hf engine on the tiny model; the client gives
up through its own timeout, as an environment's HTTP client does."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gspo_rl.contract.schema import Keys
from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, MODEL_NAME, RedisKeys, Served, running_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
N, MAX_TOKENS = 8, 2000
IDLE_TIMEOUT_S = 180.0
LONG = {"n": N, "max_tokens": MAX_TOKENS, "ignore_eos": True}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/completions": {"model": MODEL_NAME, "prompt": [1, 2, 3], **LONG},
    "/v1/chat/completions": {"model": MODEL_NAME, "messages": [{"role": "user",
                                                                "content": "hi"}], **LONG},
    "/v1/rollouts": {"prompt_token_ids": [1, 2, 3], **LONG},
}


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, redis_mod: RedisServer) -> Iterator[Served]:
    with running_server(tiny_model_dir, redis_mod.url, max_tokens=MAX_TOKENS) as s:
        yield s


def _wait_idle(served: Served) -> dict[str, float]:
    engine = served.app.state.engine
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        stats = engine.stats()
        if stats.running == 0 and stats.waiting == 0:
            return stats.extra
        assert time.monotonic() < deadline, f"engine still busy: {stats}"
        time.sleep(0.05)


def _metric(served: Served, name: str, route: str) -> float:
    text = httpx.get(served.url + "/metrics", timeout=10).text
    line = f'{name}{{route="{route}"}} '
    values = [float(x.split(" ")[-1]) for x in text.splitlines() if x.startswith(line)]
    return values[0] if values else 0.0


@pytest.mark.parametrize("path", list(BODIES))
def test_disconnected_client_aborts_generation_and_records_nothing(
    served: Served, redis_mod: RedisServer, path: str,
) -> None:
    rkeys = RedisKeys(redis_mod.url, Keys())
    before = rkeys.snapshot()
    tokens_before = _wait_idle(served).get("tokens_generated", 0.0)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(served.url + path, json=BODIES[path], headers=AUTH, timeout=1.0)
    extra = _wait_idle(served)
    generated = extra.get("tokens_generated", 0.0) - tokens_before
    assert generated < N * MAX_TOKENS, "the engine decoded the whole request for nobody"
    time.sleep(0.2)  # a handler that was not cancelled would record right after generation
    assert rkeys.snapshot() == before, "a group was recorded for a client that left"
    assert _metric(served, "gspo_requests_disconnected_total", path) == 1.0
    ok = httpx.post(served.url + path, json={**BODIES[path], "n": 1, "max_tokens": 2,
                                             "ignore_eos": False}, headers=AUTH, timeout=60)
    assert ok.status_code == 200, ok.text
    rkeys.close()
