"""Shared fixtures: real parts on free ports, cleaned up after each test."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gspo_rl.contract.net import free_port

if TYPE_CHECKING:  # tests.helpers.serving imports this module
    import openai
    import redis

    from tests.helpers.serving import RedisKeys, Served


def wait_for_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open within {timeout}s")


def wait_until(cond: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    """Poll ``cond`` every 50 ms until it is true; TimeoutError naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout}s")
        time.sleep(0.05)


@dataclass
class RedisServer:
    """A real redis-server on a free port with its own data directory."""

    dir: Path
    port: int = field(default_factory=free_port)
    appendonly: bool = False
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server not found: run scripts/setup.sh")
        args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--daemonize", "no", "--loglevel", "warning",
                "--logfile", str(self.dir / "redis.log")]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            args += ["--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, self.proc)

    def stop(self, hard: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if hard:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self, hard: bool = False) -> None:
        self.stop(hard=hard)
        self.start()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server for one test (no persistence)."""
    d = tmp_path / "redis"
    d.mkdir()
    server = RedisServer(dir=d)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_aof_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server with AOF (appendfsync everysec), restartable in the test."""
    d = tmp_path / "redis-aof"
    d.mkdir()
    server = RedisServer(dir=d, appendonly=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A redis-py client (bytes replies) of the test's own ``redis_server``."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@contextlib.contextmanager
def redis_for_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server shared by one test module's server (tests assert on deltas)."""
    server = RedisServer(dir=tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def redis_mod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """``redis_for_module`` as a module-scoped fixture."""
    with redis_for_module(tmp_path_factory) as server:
        yield server


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 model with tied embeddings (made locally, seed 0)."""
    from gspo_rl.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-tied"), seed=0, tie_embeddings=True)


@pytest.fixture(scope="session")
def tiny_model_untied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 model with separate input and output embeddings (seed 1)."""
    from gspo_rl.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-untied"), seed=1, tie_embeddings=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    have_gpu = torch.cuda.is_available()
    for item in items:
        if "gpu" in item.keywords and not have_gpu:
            item.add_marker(skip_gpu)
    _long_modules_first(items)


def _long_modules_first(items: list[pytest.Item]) -> None:
    """The modules with a ``slow`` or ``vllm`` test first, each module's tests together and in
    order: xdist's ``--dist loadfile`` hands modules out in this order, so the minutes-long
    ones start at once instead of one of them ending the run alone on one worker."""
    long_ = {item.path for item in items
             if item.get_closest_marker("slow") or item.get_closest_marker("vllm")}
    items.sort(key=lambda item: item.path not in long_)  # stable: the order within each kind


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# A rollout server with default settings, its openai client and its Redis keys: shared by the
# API test modules (one server per module). A module that needs other settings defines its own
# ``served`` (or ``client``), which takes precedence over these.
@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, redis_mod: RedisServer) -> Iterator[Served]:
    from tests.helpers.serving import running_server

    with running_server(tiny_model_dir, redis_mod.url) as s:
        yield s


@pytest.fixture(scope="module")
def client(served: Served) -> openai.OpenAI:
    import openai

    from tests.helpers.serving import API_KEY

    return openai.OpenAI(base_url=served.v1, api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def rkeys(redis_mod: RedisServer) -> Iterator[RedisKeys]:
    from gspo_rl.contract.schema import Keys
    from tests.helpers.serving import RedisKeys

    keys = RedisKeys(redis_mod.url, Keys())
    yield keys
    keys.close()
