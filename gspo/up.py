"""``gspo up``: the whole system on one machine, in one command.

Starts (each as its own process, as in a real deployment): Redis (unless a URL is given), one
rollout server on a tiny local model (unless a model is given), the learner with the weight
broadcast on, and the example environment (in this process, through the SDK). Shows a progress
bar with reward, throughput and staleness; writes ``metrics.jsonl`` (the learner's) and
``reward_curve.png`` into the run directory; stops every process it started, also on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx


@dataclass
class UpConfig:
    """Settings of one ``gspo up`` run (the CLI's flags)."""

    run_dir: Path
    model: str | None = None  # None: make a tiny model in the run directory
    redis_url: str | None = None  # None: start a redis-server of our own
    loss: str = "gspo"
    max_steps: int = 300
    groups_per_step: int = 4
    group_size: int = 8
    lr: float = 2e-3
    max_staleness: int = 2
    concurrency: int = 4  # groups sampled at the same time by the environment
    minutes: float = 10.0  # hard wall-clock limit
    target_reward: float | None = None  # stop once the last 32 sampled groups average this
    seed: int = 0
    extra_learn_args: list[str] = field(default_factory=list)


@dataclass
class UpResult:
    steps: int
    rewards: list[float]  # the learner's reward_mean per step (trained groups only)
    sampled: list[tuple[int, float, int]]  # (policy version, mean reward, groups): every group
    seconds: float
    metrics_path: Path
    plot_path: Path | None
    target_reached: bool | None = None  # None: no target was set


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Processes:
    """Child processes with their logs; ``stop_all`` terminates, then kills, in reverse."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 (closed in stop_all)
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs.append((name, proc, log))
        return proc

    def check(self, name: str) -> None:
        for n, proc, _ in self.procs:
            if n == name and proc.poll() is not None:
                tail = (self.log_dir / f"{n}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{n} exited with {proc.returncode}:\n{tail}")

    def stop_all(self, timeout_s: float = 15.0) -> None:
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for _, proc, log in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            log.close()
        self.procs.clear()


def _wait_http(url: str, procs: Processes, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs.check(name)
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{name} did not answer {url} within {timeout_s}s")


def _start_redis(procs: Processes, run_dir: Path) -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not found: run scripts/setup.sh, or pass --redis-url")
    port = _free_port()
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


def _gspo(*args: str) -> list[str]:
    return [sys.executable, "-m", "gspo.cli", *args]


def start_stack(cfg: UpConfig, procs: Processes) -> tuple[str, str, str, Path]:
    """Redis, model, server, learner. Returns (server URL, api key, redis URL, metrics)."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    redis_url = cfg.redis_url or _start_redis(procs, cfg.run_dir)
    model = cfg.model
    if model is None:
        from server.tiny_model import make_tiny_model

        model = str(make_tiny_model(cfg.run_dir / "model", seed=cfg.seed))
    api_key, admin_key = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    keys_env = {"GSPO_API_KEY": api_key, "GSPO_ADMIN_KEY": admin_key}
    port = _free_port()
    procs.start("server", _gspo("serve", "--model", model, "--port", str(port),
                                "--redis-url", redis_url, "--server-id", "up-server",
                                "--log-level", "warning"), env=keys_env)
    url = f"http://127.0.0.1:{port}"
    _wait_http(f"{url}/health", procs, "server", timeout_s=120)
    metrics = cfg.run_dir / "metrics.jsonl"
    procs.start("learner", _gspo(
        "learn", "--model", model, "--redis-url", redis_url, "--loss", cfg.loss,
        "--max-staleness", str(cfg.max_staleness), "--groups-per-step",
        str(cfg.groups_per_step), "--lr", str(cfg.lr), "--max-steps", str(cfg.max_steps),
        "--save-dir", str(cfg.run_dir / "checkpoints"), "--metrics-jsonl", str(metrics),
        "--weight-sync", "broadcast", "--seed", str(cfg.seed), *cfg.extra_learn_args),
        env=keys_env)
    return url, api_key, redis_url, metrics


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def plot_rewards(records: list[dict[str, Any]], sampled: list[tuple[int, float, int]],
                 path: Path, title: str) -> Path | None:
    """Two curves against the policy version: the reward of every sampled group (what the
    policy earns) and the learner's reward (the groups it trained on). Saved as a PNG."""
    points = [(r["step"], r["reward_mean"]) for r in records if "reward_mean" in r]
    if not points and not sampled:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if sampled:
        versions, means, counts = zip(*sampled, strict=True)
        smooth = _moving(list(means), max(1, len(means) // 10))
        ax.plot(versions, means, alpha=0.3, color="C0")
        ax.plot(versions, smooth, color="C0",
                label=f"every sampled group ({sum(counts)} groups), by sampling version")
    if points:
        steps, rewards = zip(*points, strict=True)
        ax.plot(steps, _moving(list(rewards), max(1, len(rewards) // 10)), color="C1",
                label="groups the learner trained on (equal-reward groups excluded)")
    ax.set_xlabel("policy version (learner step)")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _moving(xs: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(xs)):
        part = xs[max(0, i - window + 1):i + 1]
        out.append(sum(part) / len(part))
    return out


ENV_WINDOW = 32  # groups in the environment-side moving average


def _exit_code(procs: Processes, name: str) -> int | None:
    for n, proc, _ in procs.procs:
        if n == name:
            return proc.poll()
    return None


def _status(records: list[dict[str, Any]], env_rewards: deque[float]) -> dict[str, Any]:
    records = [r for r in records if r.get("event", "step") == "step"]
    last = records[-1] if records else {}
    hist = last.get("staleness", {}) or {}
    n = sum(hist.values())
    stale = sum(int(k) * v for k, v in hist.items()) / n if n else 0.0
    recent = [r["reward_mean"] for r in records[-5:] if "reward_mean" in r]
    return {"step": int(last.get("step", 0)),
            "reward": sum(recent) / len(recent) if recent else float("nan"),
            "env_reward": sum(env_rewards) / len(env_rewards) if env_rewards else float("nan"),
            "tok_s": float(last.get("tokens_per_s", 0.0)), "staleness": stale}


def _backlog_gate(redis_url: str, max_backlog: int, stop: asyncio.Event) -> Any:
    """Backpressure: wait while more than ``max_backlog`` published groups wait undelivered
    to the learner (the consumer group's lag). Sampling further ahead would only produce
    groups that the staleness bound drops."""
    import redis.asyncio as aredis

    from server.redis_schema import LEARNER_CONSUMER_GROUP, Keys

    client = aredis.Redis.from_url(redis_url, socket_timeout=5)
    stream = Keys().ready_stream

    async def backlog() -> int:
        try:
            groups = await client.xinfo_groups(stream)
        except Exception:  # no stream / no consumer group yet: nothing waits
            return 0
        for g in groups:
            if g.get("name") in (LEARNER_CONSUMER_GROUP, LEARNER_CONSUMER_GROUP.encode()):
                lag = g.get("lag")
                return int(lag) if lag is not None else int(await client.xlen(stream))
        return int(await client.xlen(stream))

    async def gate() -> None:
        while not stop.is_set() and await backlog() >= max_backlog:
            await asyncio.sleep(0.1)

    return gate


async def _drive(cfg: UpConfig, url: str, api_key: str, redis_url: str, metrics: Path,
                 procs: Processes, on_status: Any) -> None:
    """Run the example environment until the learner finishes, the clock runs out, or the
    target reward is reached; surface any child's crash at once."""
    from clients.client import AsyncGSPOClient
    from clients.environment import arun_groups
    from clients.examples.alphabet import AlphabetEnvironment

    env = AlphabetEnvironment(group_size=cfg.group_size)
    stop = asyncio.Event()
    gate = _backlog_gate(redis_url, cfg.groups_per_step * (cfg.max_staleness + 1), stop)
    env_rewards: deque[float] = deque(maxlen=ENV_WINDOW)
    env_log = open(cfg.run_dir / "env_rewards.jsonl", "a")  # noqa: SIM115 (closed below)

    def on_group(g: Any) -> None:
        reward = sum(g.rewards) / len(g.rewards)
        env_rewards.append(reward)
        env_log.write(json.dumps({"time": time.time(), "group_id": g.group_id,
                                  "version": min(g.versions) if g.versions else -1,
                                  "reward": reward}) + "\n")
        env_log.flush()

    deadline = time.monotonic() + cfg.minutes * 60
    async with AsyncGSPOClient(url, api_key=api_key) as client:
        runner = asyncio.create_task(arun_groups(
            env, client, None, concurrency=cfg.concurrency, seed=cfg.seed, stop=stop,
            on_group=on_group, gate=gate))
        try:
            while True:
                await asyncio.sleep(0.5)
                if runner.done():
                    runner.result()  # an environment error ends the run, loudly
                procs.check("server")
                status = _status(read_metrics(metrics), env_rewards)
                on_status(status)
                code = _exit_code(procs, "learner")
                if code is not None:
                    if code != 0:
                        procs.check("learner")
                    break
                if time.monotonic() > deadline:
                    break
                if (cfg.target_reward is not None and len(env_rewards) == ENV_WINDOW
                        and status["env_reward"] >= cfg.target_reward):
                    break
        finally:
            env_log.close()
            stop.set()
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(runner, timeout=10)


def run_up(cfg: UpConfig) -> UpResult:
    """Start everything, train, stop everything (also on Ctrl-C / SIGTERM), plot."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    procs = Processes(cfg.run_dir)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    t0 = time.monotonic()
    metrics = cfg.run_dir / "metrics.jsonl"
    try:
        url, api_key, redis_url, metrics = start_stack(cfg, procs)
        columns = [TextColumn("[bold]{task.description}"), BarColumn(),
                   TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
                   TextColumn("{task.fields[info]}"), TimeElapsedColumn()]
        with Progress(*columns, refresh_per_second=4) as progress:
            task = progress.add_task("training", total=cfg.max_steps, info="starting")

            def on_status(s: dict[str, Any]) -> None:
                info = (f"reward {s['reward']:.2f} (env {s['env_reward']:.2f})  "
                        f"{s['tok_s']:.0f} tok/s  staleness {s['staleness']:.2f}")
                progress.update(task, completed=s["step"], info=info)

            asyncio.run(_drive(cfg, url, api_key, redis_url, metrics, procs, on_status))
    finally:
        procs.stop_all()
        signal.signal(signal.SIGTERM, previous)
    records = [r for r in read_metrics(metrics) if r.get("event", "step") == "step"]
    sampled = version_curve(read_metrics(cfg.run_dir / "env_rewards.jsonl"))
    plot = plot_rewards(records, sampled, cfg.run_dir / "reward_curve.png",
                        f"gspo up: {cfg.loss} on the alphabet task")
    rewards = [float(r["reward_mean"]) for r in records if "reward_mean" in r]
    reached = None
    if cfg.target_reward is not None:
        env = [float(r["reward"]) for r in read_metrics(cfg.run_dir / "env_rewards.jsonl")]
        reached = len(env) >= ENV_WINDOW and any(
            m >= cfg.target_reward for m in _moving(env, ENV_WINDOW)[ENV_WINDOW - 1:])
    return UpResult(steps=len(records), rewards=rewards, sampled=sampled,
                    seconds=time.monotonic() - t0, metrics_path=metrics, plot_path=plot,
                    target_reached=reached)


def version_curve(env_records: list[dict[str, Any]]) -> list[tuple[int, float, int]]:
    """Mean reward of every group the environment finished, by the policy version that
    sampled it. Unlike the learner's reward (groups it trained on), this includes the groups
    dropped for equal rewards, which become common as the policy gets good."""
    by_version: dict[int, list[float]] = {}
    for r in env_records:
        by_version.setdefault(int(r["version"]), []).append(float(r["reward"]))
    return [(v, sum(x) / len(x), len(x)) for v, x in sorted(by_version.items()) if v >= 0]


def summarize(records: list[dict[str, Any]], threshold: float = 0.8, window: int = 5,
              env_records: list[dict[str, Any]] | None = None) -> dict[str, float]:
    """Figures of one run from its learner step records (and the environment's groups).

    ``tokens_per_s``: tokens trained per second of wall time, first step to last.
    ``time_to_threshold_s``: wall seconds from the first step until the ``window``-step moving
    average of the learner's reward first reaches ``threshold`` (NaN if it never does).
    ``final_reward``: that moving average over the last ``window`` steps.
    With ``env_records`` (``env_rewards.jsonl``), the same for every sampled group over a
    moving window of ``ENV_WINDOW`` groups: ``sampled_time_to_threshold_s`` (from the first
    group) and ``sampled_final_reward``.
    """
    steps = [r for r in records if r.get("event", "step") == "step" and "reward_mean" in r]
    out: dict[str, float] = {"steps": float(len(steps))}
    if env_records:
        rewards = [float(r["reward"]) for r in env_records]
        moving = _moving(rewards, ENV_WINDOW)
        t0 = env_records[0]["time"]
        out["sampled_final_reward"] = moving[-1]
        out["sampled_time_to_threshold_s"] = next(
            (env_records[i]["time"] - t0 for i, m in enumerate(moving)
             if i + 1 >= ENV_WINDOW and m >= threshold), float("nan"))
    if len(steps) < 2:
        return out
    t0, t1 = steps[0]["time"], steps[-1]["time"]
    moving = _moving([float(r["reward_mean"]) for r in steps], window)
    stale = [(int(k), v) for r in steps for k, v in (r.get("staleness") or {}).items()]
    n_stale = sum(v for _, v in stale)
    out.update({
        "tokens_per_s": sum(float(r.get("tokens", 0)) for r in steps[1:]) / max(t1 - t0, 1e-9),
        "time_to_threshold_s": next((steps[i]["time"] - t0 for i, m in enumerate(moving)
                                     if m >= threshold), float("nan")),
        "final_reward": moving[-1],
        "staleness_mean": sum(k * v for k, v in stale) / n_stale if n_stale else 0.0,
        "clip_fraction_mean": sum(float(r.get("clip_fraction", 0.0)) for r in steps) / len(steps),
        "dropped_stale": float((steps[-1].get("dropped") or {}).get("dropped_stale", 0)),
    })
    return out
