"""The child processes of ``gspo up`` and ``gspo eval --model``: started with their logs in a
directory, checked, and stopped in the reverse order of their start, one at a time.

One at a time matters: each process is told to stop (SIGTERM) only once the ones started after
it have exited, so the learner's last checkpoint and acknowledgement reach Redis and the
server before either stops (signalled together, Redis went first and the learner logged "ack
failed ... Connection refused" in every run), and the server answers its requests in flight
while Redis still takes their records. Each gets its own patience (``STOP_PATIENCE_S``: the
learner finishes a step and checkpoints), then SIGKILL. A second Ctrl-C while they stop
kills the rest at once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import httpx

from gspo_rl.contract.net import free_port

STOP_PATIENCE_S = {"learner": 120.0, "server": 45.0, "redis": 30.0}
DEFAULT_PATIENCE_S = 15.0


class Processes:
    """Child processes with their logs; ``stop_all`` stops them in reverse, one at a time."""

    def __init__(self, log_dir: Path, cpus: dict[str, list[int]] | None = None) -> None:
        self.log_dir = log_dir
        self.cpus = cpus or {}
        self.procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        """Start ``name``; pinned to ``self.cpus[name]`` (set in the child before exec, so
        every thread it makes inherits it) with as many torch threads, when given."""
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 (closed in stop_all)
        cpus = self.cpus.get(name)
        env = {**os.environ, **(env or {})}
        if cpus:
            env["OMP_NUM_THREADS"] = str(len(cpus))
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=pin)
        self.procs.append((name, proc, log))
        return proc

    def alive(self, name: str) -> bool:
        return any(n == name and proc.poll() is None for n, proc, _ in self.procs)

    def exit_code(self, name: str) -> int | None:
        for n, proc, _ in self.procs:
            if n == name:
                return proc.poll()
        return None

    def check(self, name: str) -> None:
        for n, proc, _ in self.procs:
            if n == name and proc.poll() is not None:
                tail = (self.log_dir / f"{n}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{n} exited with {proc.returncode}:\n{tail}")

    def stop_all(self, patience_s: dict[str, float] | None = None) -> None:
        """SIGTERM each process, newest first, and wait for it (its patience, then SIGKILL)
        before the next. Interrupted (Ctrl-C): every process still running is killed."""
        patience = {**STOP_PATIENCE_S, **(patience_s or {})}
        try:
            for name, proc, _ in reversed(self.procs):
                _stop(proc, patience.get(name, DEFAULT_PATIENCE_S))
        except KeyboardInterrupt:
            for _, proc, _ in self.procs:
                _kill(proc)
            raise
        finally:
            for _, _, log in self.procs:
                log.close()
            self.procs.clear()


def _stop(proc: subprocess.Popen[bytes], patience_s: float) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=patience_s)
    except subprocess.TimeoutExpired:
        _kill(proc)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def wait_http(url: str, procs: Processes, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs.check(name)
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{name} did not answer {url} within {timeout_s}s")


def start_redis(procs: Processes, run_dir: Path) -> str:
    """A redis-server of our own on a free loopback port, its files in ``run_dir/redis``."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not found: run scripts/setup.sh, or pass --redis-url")
    port = free_port()
    data = run_dir / "redis"
    data.mkdir(exist_ok=True)
    procs.start("redis", [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                          "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        procs.check("redis")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return f"redis://127.0.0.1:{port}/0"
        time.sleep(0.05)
    raise TimeoutError("redis-server did not start within 20 s")


def gspo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gspo_rl.cli", *args]
