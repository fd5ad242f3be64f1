"""A vLLM-backed rollout server for tests, driven over HTTP and directly on its event loop.

``serve_vllm`` runs the real app (``engine="vllm"``) under uvicorn on an event loop in a
background thread, so a test can also call ``app.state.engine`` on that same loop (AsyncLLM is
bound to the loop it runs on). ``Stack.ref`` is a transformers copy of the weights the engine
serves; tests that change the engine's weights change it the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gspo_rl.server.engines.base import Completion, SamplingParams
from tests.conftest import free_port
from tests.helpers.reference_logprobs import sequence_logprobs
from tests.helpers.serving import ADMIN_KEY, API_KEY, MODEL_NAME

T = TypeVar("T")
START_TIMEOUT_S = 600.0  # a vLLM engine starts in ~20 s; far slower on a loaded 2-core box


class LoopThread:
    """An event loop in a daemon thread; ``run`` submits a coroutine and waits (bounded)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coro: Awaitable[T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def run(self, coro: Awaitable[T], timeout: float = 120.0) -> T:
        return self.submit(asyncio.wait_for(coro, timeout)).result(timeout + 10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class Stack:
    """A served vLLM engine: its URL, its app (``engine``), and the reference weights."""

    loop: LoopThread
    url: str
    app: Any
    ref: torch.nn.Module  # the weights the engine serves now
    redis_url: str
    tied: bool
    server_id: str
    tokenizer: Any

    @property
    def engine(self) -> Any:
        return self.app.state.engine

    def gen(self, prompt: list[int], **kw: Any) -> Completion:
        return self.loop.run(self.engine.generate(prompt, SamplingParams(**kw)))

    def gen_all(self, reqs: list[tuple[list[int], SamplingParams]]) -> list[Completion]:
        async def body() -> list[Completion]:
            return list(await asyncio.gather(*[self.engine.generate(p, s) for p, s in reqs]))
        return self.loop.run(body())


def _wait_healthy(url: str, fut: Future[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fut.done():
            raise RuntimeError(f"the server exited during start-up: {fut.exception()!r}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"/health not 200 within {timeout}s")


@contextlib.contextmanager
def serve_vllm(model_dir: Path, redis_url: str, server_id: str,
               **overrides: Any) -> Iterator[Stack]:
    """The real app with ``engine="vllm"`` on ``model_dir`` under uvicorn, on a loop thread
    the tests share; the app's lifespan starts the engine and shuts it down. ``overrides``:
    ``ServerSettings`` fields to change from the defaults below."""
    import uvicorn

    from gspo_rl.server.api.app import create_app
    from gspo_rl.server.config import ServerSettings

    port = free_port()
    fields: dict[str, Any] = dict(
        engine="vllm", model=str(model_dir), redis_url=redis_url, served_model_name=MODEL_NAME,
        api_key=API_KEY, admin_key=ADMIN_KEY, max_n=8, max_tokens=64, max_batch_size=16,
        port=port, server_id=server_id)
    settings = ServerSettings(**{**fields, **overrides})
    app = create_app(settings)
    loop = LoopThread()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    served = loop.submit(server.serve())
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, served, START_TIMEOUT_S)
        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        yield Stack(loop, url, app, ref, redis_url, bool(ref.config.tie_word_embeddings),
                    server_id, AutoTokenizer.from_pretrained(model_dir))
    finally:
        server.should_exit = True
        served.result(120)
        loop.close()


def max_err(ref: torch.nn.Module, prompt: list[int], out: Completion, temp: float) -> float:
    theirs = sequence_logprobs(ref, prompt + out.token_ids, len(prompt), temp)
    return max(abs(a - b) for a, b in zip(theirs, out.logprobs, strict=True))


def perturb(ref: torch.nn.Module, names: list[str] | None, seed: int, scale: float = 0.05
            ) -> list[tuple[str, torch.Tensor]]:
    """Move ``names`` (all parameters: None) of ``ref`` in place; returns them, HF-named."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if names is None or name in names:
                p.add_(scale * torch.randn(p.shape, generator=gen))
                out.append((name, p.detach().clone()))
    return out


LORA_PROMPT = [5, 17, 42, 99, 7, 300, 12]


def lora_parity(stack: Stack, model: torch.nn.Module, version: int) -> None:
    """The served log-probabilities of ``LORA_PROMPT`` equal ``model``'s, sampled at
    ``version`` (an unrecorded request: admission never holds it)."""
    for temperature in (1.0, 0.7):
        r = httpx.post(f"{stack.url}/v1/completions", timeout=120,
                       headers={"Authorization": f"Bearer {API_KEY}"},
                       json={"model": MODEL_NAME, "prompt": LORA_PROMPT, "max_tokens": 12,
                             "seed": 3, "temperature": temperature, "logprobs": 1,
                             "record": False})  # no group: never held by admission
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert set(choice["policy_versions"]) == {version}
        with torch.no_grad():
            ours = sequence_logprobs(model, LORA_PROMPT + choice["token_ids"], len(LORA_PROMPT),
                                     temperature)
        torch.testing.assert_close(torch.tensor(choice["logprobs"]["token_logprobs"]),
                                   torch.tensor(ours), atol=1e-4, rtol=0)


@contextlib.contextmanager
def broadcast_to(stack: Stack) -> Iterator[Any]:
    """A ``BroadcastSync`` to the stack's server, once it has registered."""
    import redis

    from gspo_rl.contract.schema import Keys
    from gspo_rl.learner.weights.broadcast import BroadcastSync
    from gspo_rl.redisq.registry import live_servers

    client = redis.Redis.from_url(stack.redis_url)
    deadline = time.monotonic() + 30
    while [s.server_id for s in live_servers(client, Keys())] != [stack.server_id]:
        assert time.monotonic() < deadline, "the server did not register"
        time.sleep(0.1)
    sync = BroadcastSync(client, Keys(), admin_key=ADMIN_KEY, timeout_s=30)
    try:
        yield sync
    finally:
        sync.close()
        client.close()


def adapter_pushes(stack: Stack, model_dir: Path) -> torch.nn.Module:
    """Three adapter pushes (every projection; the same modules moved; q_proj alone), parity
    after each; then a malformed adapter is refused and the last one stays. Returns the last
    learner model (PEFT-wrapped)."""
    from peft import LoraConfig, get_peft_model


    v = stack.engine.policy_version
    with broadcast_to(stack) as sync:
        for step, targets in enumerate((["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                         "up_proj", "down_proj"], None, ["q_proj"]), start=1):
            if targets is not None:  # a fresh learner model with these adapters
                model = AutoModelForCausalLM.from_pretrained(model_dir,
                                                             dtype=torch.float32)
                get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
            g = torch.Generator().manual_seed(step)
            with torch.no_grad():
                for p in model.parameters():
                    if p.requires_grad:
                        p.add_(torch.randn(p.shape, generator=g) * 0.05)
            report = sync.push(model, version=v + step)
            assert report.ok and report.lora, report
            lora_parity(stack, model, v + step)
        # an adapter for a weight this model does not have: refused, nothing loaded
        r = httpx.post(f"{stack.url}/admin/weights/update",
                       headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30,
                       json={"epoch": sync.epoch, "version": v + 9, "tensors": [
                           {"name": "nope.lora_A.weight", "dtype": "float32", "shape": [4, 8]},
                           {"name": "nope.lora_B.weight", "dtype": "float32", "shape": [8, 4]}],
                           "lora": {"rank": 4, "alpha": 8, "target_modules": ["nope"]}})
        assert r.status_code == 504 and "does not have" in r.text, r.text
        lora_parity(stack, model, v + 3)
    return model
