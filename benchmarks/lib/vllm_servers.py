"""The two servers ``benchmarks/bench_vs_vllm.py`` compares, Redis, and its lean HTTP client.

Each server runs in its own process group (its engine core and workers included), so it can
be stopped as a whole and its CPU time read from ``/proc`` (``group_cpu_s``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from gspo_rl.contract.net import free_port

REPO = Path(__file__).resolve().parents[2]
API_KEY = "bench-key"
MODEL_NAME = "tiny"
START_TIMEOUT_S = 600.0


def cpu_worker_cls() -> str:
    from gspo_rl.server.engines.vllm.args import CPU_WORKER_CLS

    return CPU_WORKER_CLS


# ---------------------------------------------------------------------- processes


def _wait(check, proc: subprocess.Popen, what: str, timeout: float,  # noqa: ANN001
          log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-4000:] if log else ""
            raise RuntimeError(f"{what} exited with {proc.returncode} during start-up\n{tail}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready within {timeout}s")
        time.sleep(0.2)


def _get_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def process_group(cmd: list[str], what: str, ready_url: str, env: dict[str, str],
                  log: Path, wait: bool = True) -> Iterator[subprocess.Popen]:
    """``cmd`` in its own process group (its children too), logging to ``log``, yielded once
    ``ready_url`` answers 200 (``wait=False``: at once; see ``wait_up``); stopped as a group
    (SIGTERM, then SIGKILL after 60 s)."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own group: vLLM's children too
        try:
            if wait:
                _wait(lambda: _get_ok(ready_url), proc, what, START_TIMEOUT_S, log)
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)


@contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found: run scripts/setup.sh")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis

        client = redis.Redis(port=port, socket_timeout=2)
        _wait(lambda: _ping(client), proc, "redis-server", 30)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _ping(client) -> bool:  # noqa: ANN001
    try:
        return bool(client.ping())
    except Exception:
        return False


def group_cpu_s(pgid: int) -> tuple[float, float]:
    """CPU seconds (user + system) used so far by the live processes of group ``pgid`` (a
    server with its engine core and workers), and by its leader alone (the HTTP front, which
    also runs AsyncLLM's output handling). Steadier than tokens/s under other jobs' load."""
    tick = os.sysconf("SC_CLK_TCK")
    total = front = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            used = int(fields[11]) + int(fields[12])
            total += used
            if stat.parent.name == str(pgid):
                front = used
    return total / tick, front / tick


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen
    log: Path
    fixed: bool = False  # vLLM's server with our CPU worker class
    dead: str | None = None  # why it is out of the run

    def check_alive(self) -> None:
        if self.dead:
            return
        if self.proc.poll() is not None:
            self.dead = f"process exited with {self.proc.returncode}"
            return
        try:
            r = httpx.get(f"{self.url}/health", timeout=10)
        except httpx.TransportError as exc:
            self.dead = f"/health unreachable: {exc!r}"
            return
        if r.status_code != 200:
            self.dead = f"/health {r.status_code}: {r.text[:200]}"

    def death_cause(self) -> str:
        """The first line of its log naming the error (the root cause comes first)."""
        lines = self.log.read_text(errors="replace").splitlines()
        for marks in (("RuntimeError", "ENGINE DEAD"), ("Error",)):
            hits = [ln for ln in lines if any(m in ln for m in marks)]
            if hits:
                return hits[0][-300:]
        return "(nothing in its log)"


def engine_env() -> dict[str, str]:
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}


@contextmanager
def ours(model: Path, redis_url: str, args: argparse.Namespace, log: Path,
         wait: bool = True) -> Iterator[Server]:
    port = free_port()
    cmd = [sys.executable, "-m", "gspo_rl.cli", "serve", "--engine", "vllm", "--model", str(model),
           "--served-model-name", MODEL_NAME, "--port", str(port), "--redis-url", redis_url,
           "--max-batch-size", str(args.max_num_seqs), "--max-model-len",
           str(args.max_model_len), "--max-tokens", str(args.max_tokens), "--max-n", "1",
           "--log-level", "warning"]
    # No learner runs: no bound on the ready queue or on groups in flight
    # (gspo_rl.server.rollouts.admission).
    env = {**engine_env(), "GSPO_API_KEY": API_KEY, "GSPO_MAX_READY_GROUPS": "0",
           "GSPO_ADMISSION": "false"}
    url = f"http://127.0.0.1:{port}"
    with process_group(cmd, "gspo serve", f"{url}/health", env, log, wait) as proc:
        yield Server("ours", url, proc, log)


@contextmanager
def vllm_server(model: Path, args: argparse.Namespace, log: Path,
                fixed: bool = False, wait: bool = True) -> Iterator[Server]:
    """vLLM's own server; ``fixed``: with our CPU worker (``--worker-cls``), which keeps
    seeded requests alive through chunked prefill (``gspo_rl.server.engines.vllm.cpu_worker``)."""
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
           "--api-key", API_KEY, "--dtype", "float32", "--enforce-eager", "--max-num-seqs",
           str(args.max_num_seqs), "--max-model-len", str(args.max_model_len), "--seed", "0",
           "--enable-prefix-caching", "--logprobs-mode", "processed_logprobs",
           "--generation-config", "vllm", "--disable-log-stats",
           "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]
    if fixed:
        cmd += ["--worker-cls", cpu_worker_cls()]
    url = f"http://127.0.0.1:{port}"
    with process_group(cmd, "vLLM's api_server", f"{url}/health", engine_env(), log,
                       wait) as proc:
        yield Server("vLLM", url, proc, log, fixed=fixed)


# ---------------------------------------------------------------------- load


class LeanClient:
    """HTTP/1.1 keep-alive, one connection per worker, JSON in and out: ~0.3 ms of CPU per
    request where the openai client costs ~5 ms (it shares the cores with the servers)."""

    def __init__(self, url: str) -> None:
        u = httpx.URL(url)
        self.host, self.port = u.host, u.port or 80
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: dict) -> tuple[int, bytes]:
        data = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/"
                f"json\r\nAuthorization: Bearer {API_KEY}\r\nContent-Length: {len(data)}\r\n\r\n")
        if self.conn is None:
            self.conn = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.conn
        try:
            writer.write(head.encode() + data)
            status = await reader.readline()
            length, chunked = 0, False
            while (line := await reader.readline()) not in (b"\r\n", b""):
                low = line.lower()
                if low.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
                elif low.startswith(b"transfer-encoding:") and b"chunked" in low:
                    chunked = True
            payload = await (self._chunks(reader) if chunked else reader.readexactly(length))
        except (OSError, asyncio.IncompleteReadError):
            self.close()
            raise
        parts = status.split()
        return (int(parts[1]) if len(parts) > 1 else 0), payload

    @staticmethod
    async def _chunks(reader: asyncio.StreamReader) -> bytes:
        out = b""
        while (size := int((await reader.readline()).strip() or b"0", 16)) > 0:
            out += await reader.readexactly(size)
            await reader.readline()
        await reader.readline()
        return out

    def close(self) -> None:
        if self.conn is not None:
            self.conn[1].close()
            self.conn = None


def wait_up(server: Server) -> None:
    """Wait until a server started with ``wait=False`` answers ``/health`` with 200."""
    _wait(lambda: _get_ok(f"{server.url}/health"), server.proc, server.name,
          START_TIMEOUT_S, server.log)
