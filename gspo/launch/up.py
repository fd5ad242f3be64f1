"""``gspo up``: the whole system on one machine, in one command.

Starts (each as its own process, as in a real deployment): Redis (unless a URL is given), one
rollout server on a tiny local model (unless a model is given), the learner with the weight
broadcast on, and the example environment (in this process, through the SDK). Shows a progress
bar with reward, throughput and staleness; writes ``metrics.jsonl`` (the learner's) and
``reward_curve.png`` into the run directory; stops every process it started, also on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from gspo_rl.contract.net import free_port
from gspo_rl.launch.aio import run_interruptible
from gspo_rl.launch.config import LORA_LR, UP_DEFAULTS, UpConfig
from gspo_rl.launch.drive import drive
from gspo_rl.launch.processes import Processes, gspo_command, start_redis, wait_http
from gspo_rl.launch.run_dir import groups_played, set_aside_previous_run
from gspo_rl.launch.runlog import (
    ENV_WINDOW,
    moving,
    plot_rewards,
    read_metrics,
    step_records,
    version_curve,
)
from gspo_rl.launch.tiny_cache import tiny_model
from gspo_rl.launch.workload import Workload, make_workload
from gspo_rl.learner.tracking.base import check_installed

__all__ = ["LORA_LR", "UP_DEFAULTS", "UpConfig", "UpResult", "run_up"]
# With an eval set, the learner waits this long after training for the final evaluation (an
# evaluation under way, then the final one; gspo_rl.launch.drive).
FINAL_EVAL_WAIT_S = 900.0
# after Ctrl-C, each stage of the environment's cancellation gets this long (gspo_rl.launch.aio)
INTERRUPT_GRACE_S = 20.0


@dataclass
class UpResult:
    steps: int
    rewards: list[float]  # the learner's reward_mean per step (trained groups only)
    sampled: list[tuple[int, float, int]]  # (policy version, mean reward, groups): every group
    seconds: float
    metrics_path: Path
    plot_path: Path | None
    target_reached: bool | None = None  # None: no target was set
    groups: dict[str, int] | None = None  # ``group_counts`` at the end of the run
    workload: list[str] | None = None  # per-source rewards and evaluations (tasks from data)
    interrupted: bool = False  # Ctrl-C or SIGTERM ended it: the summary of what ran

    def summary(self, target_reward: float) -> list[str]:
        """What ``gspo up`` prints at the end: the reward curve in brief, the target, every
        group's fate and where the files are."""
        lines = [f"interrupted after {self.seconds:.0f} s: what ran"] if self.interrupted \
            else []
        if self.sampled:
            first, last = self.sampled[0], self.sampled[-3:]
            late = sum(m * n for _, m, n in last) / max(1, sum(n for _, _, n in last))
            lines.append(f"reward of every sampled group: version {first[0]} {first[1]:.2f} -> "
                         f"versions {last[0][0]}-{last[-1][0]} {late:.2f} "
                         f"({self.steps} learner steps in {self.seconds:.0f} s)")
        if self.target_reached is not None:
            lines.append(f"target reward {target_reward} (0: none): " + (
                "reached; the groups in flight then were trained too (all "
                f"{self.steps} learner steps above)" if self.target_reached else
                f"NOT reached in {self.steps} learner steps"))
        if self.rewards:
            tail = self.rewards[-5:]
            lines.append("learner reward (trained groups, equal-reward groups excluded): last "
                         f"steps {sum(tail) / len(tail):.2f}")
        if self.groups is not None:
            from gspo_rl.learner.tracking.metrics import fates_line

            lines.append(fates_line(self.groups))
        lines += self.workload or []
        lines.append(f"metrics: {self.metrics_path}")
        if self.plot_path:
            lines.append(f"reward curve: {self.plot_path}")
        return lines


def _server_device_args(cfg: UpConfig) -> list[str]:
    """Server flags for ``cfg.device``. Server and learner on one GPU: the learner passes
    its weights as CUDA IPC handles (chosen automatically, ``gspo_rl.contract.weights.collective``),
    and vLLM takes only ``gpu_memory_utilization`` of the GPU so that the learner fits. float32
    on every device: the learner uses the servers' log-probabilities as pi_old ("behavior"),
    exact only when both sides compute in the same dtype (docs/gpus.md)."""
    args = ["--engine", cfg.engine, "--dtype", "float32"]
    if cfg.device is None:
        return args
    if cfg.engine == "vllm":
        if cfg.device.startswith("cuda"):
            args += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
        return args
    return [*args, "--device", cfg.device]


def _server_lora_args(cfg: UpConfig) -> list[str]:
    """vLLM serves the learner's adapters with its own LoRA support (loaded from memory); the
    hf engine merges them and needs no flag."""
    if cfg.lora_rank and cfg.engine == "vllm":
        return ["--max-lora-rank", str(cfg.lora_rank)]
    return []


def _budget_args(cfg: UpConfig) -> list[str]:
    """The server's sampling budget settings that ``gspo up`` was given (else its defaults)."""
    args = [] if cfg.no_signal_hold_s is None else ["--no-signal-hold-s",
                                                      str(cfg.no_signal_hold_s)]
    if cfg.no_signal_drought_s is not None:
        args += ["--no-signal-drought-s", str(cfg.no_signal_drought_s)]
    return args


def _tracking_args(cfg: UpConfig) -> list[str]:
    """The learner's tracking flags: its trackers write under ``run_dir/tracking``."""
    if not cfg.report_to:
        return []
    return ["--report-to", ",".join(cfg.report_to), "--tracking-dir",
            str(cfg.run_dir / "tracking"),
            *(["--run-name", cfg.run_name] if cfg.run_name else []),
            *(["--tracking-project", cfg.tracking_project] if cfg.tracking_project else [])]


def start_stack(cfg: UpConfig, procs: Processes,
                final_eval_wait_s: float = 0.0) -> tuple[str, str, str, Path]:
    """Redis, model, server, learner (which waits ``final_eval_wait_s`` for the final
    evaluation after training). Returns (server URL, api key, redis URL, metrics)."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    redis_url = cfg.redis_url or start_redis(procs, cfg.run_dir)
    model = cfg.model
    if model is None and cfg.resume and (cfg.run_dir / "model" / "config.json").is_file():
        model = str(cfg.run_dir / "model")  # the run's own tiny model, as it was made
    elif model is None:  # built once per machine, copied (gspo_rl.launch.tiny_cache)
        model = str(tiny_model(cfg.run_dir / "model", seed=cfg.seed))
    api_key, admin_key = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    keys_env = {"GSPO_API_KEY": api_key, "GSPO_ADMIN_KEY": admin_key}
    port = free_port()
    procs.start("server", gspo_command("serve", "--model", model, "--port", str(port),
                                "--redis-url", redis_url, "--server-id", "up-server",
                                "--log-level", "warning", *_server_device_args(cfg),
                                *_server_lora_args(cfg),
                                *_budget_args(cfg),
                                *([] if cfg.admission else ["--no-admission"])),
                env=keys_env)
    url = f"http://127.0.0.1:{port}"
    # The learner starts while the server does (their imports and model loads overlap): it
    # pushes its weights to the servers registered when it is ready, and to any that
    # registers later (``gspo_rl.learner.runtime.healing``), so the order does not matter. Not with
    # vLLM: it sizes its KV cache from the GPU memory free when it starts, which the learner would
    # take.
    if cfg.engine == "vllm":
        wait_http(f"{url}/health", procs, "server", timeout_s=120)
    metrics = cfg.run_dir / "metrics.jsonl"
    procs.start("learner", gspo_command(
        "learn", "--model", model, "--redis-url", redis_url, "--loss", cfg.loss,
        "--max-staleness", str(cfg.max_staleness), "--groups-per-step",
        str(cfg.groups_per_step), "--lr", str(cfg.learning_rate), "--max-steps",
        str(cfg.max_steps),
        *(["--lora-rank", str(cfg.lora_rank)] if cfg.lora_rank else []),
        "--save-dir", str(cfg.run_dir / "checkpoints"), "--metrics-jsonl", str(metrics),
        "--weight-sync", "broadcast", "--seed", str(cfg.seed),
        *(["--resume"] if cfg.resume else []),
        *(["--read-timeout-s", str(cfg.read_timeout_s)] if cfg.read_timeout_s else []),
        *(["--target-reward", str(cfg.target_reward)] if cfg.target_reward else []),
        *(["--device", cfg.device] if cfg.device else []), *_tracking_args(cfg),
        *(["--final-eval-wait-s", str(final_eval_wait_s)] if final_eval_wait_s else []),
        *cfg.extra_learn_args),
        env=keys_env)
    wait_http(f"{url}/health", procs, "server", timeout_s=120)
    # The key in the fragment: the browser never sends it, no server logs it (docs/dashboard.md)
    print(f"dashboard: {url}/dashboard#key={api_key}", flush=True)
    return url, api_key, redis_url, metrics


def group_counts(redis_url: str, prefix: str | None = None) -> dict[str, int]:
    """The fate of every group of the run, from Redis
    (``gspo_rl.learner.tracking.metrics.group_fates``)."""
    import redis

    from gspo_rl.contract.schema import Keys
    from gspo_rl.learner.tracking.metrics import group_fates

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        return group_fates(client, Keys(prefix) if prefix else Keys())
    finally:
        client.close()


def run_up(cfg: UpConfig) -> UpResult:
    """Start everything, train, stop everything (also on Ctrl-C / SIGTERM: the summary and
    the plot of what ran, ``UpResult.interrupted``), plot."""
    from gspo_rl.launch.display import make_progress, show

    check_installed(cfg.report_to)  # TrackingUnavailable before anything starts
    played = groups_played(cfg.run_dir) if cfg.resume else 0
    if cfg.resume:
        print(f"continuing the run in {cfg.run_dir}: its Redis, its newest checkpoint, "
              f"{played} groups played so far", flush=True)
    elif (previous := set_aside_previous_run(cfg.run_dir)) is not None:
        print(f"the earlier run in {cfg.run_dir} was moved to {previous}; this one starts "
              "from scratch", flush=True)
    procs = Processes(cfg.run_dir, cfg.cpus)
    groups: dict[str, int] | None = None
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    _say_settings(cfg)
    work = make_workload(cfg.tasks, cfg.data, cfg.verifier, cfg.eval_every, cfg.group_size,
                         cfg.run_dir, cfg.env, cfg.env_args)
    work.seed = cfg.seed + played  # a resumed run draws tasks past those it played
    if not cfg.selection:
        work.without_selection()
    previous_sigterm = signal.signal(signal.SIGTERM, signal.default_int_handler)
    t0 = time.monotonic()
    metrics, redis_url, interrupted = cfg.run_dir / "metrics.jsonl", None, False
    try:
        try:
            url, api_key, redis_url, metrics = start_stack(
                cfg, procs, FINAL_EVAL_WAIT_S if work.watcher is not None else 0.0)
            progress, task = make_progress(cfg.max_steps)
            with progress:
                run_interruptible(drive(cfg, work, url, api_key, metrics, procs,
                                         lambda s: show(progress, task, s, work.status())),
                                  INTERRUPT_GRACE_S)
        except KeyboardInterrupt:
            interrupted = True
            print("interrupted: stopping every process, the learner first (Ctrl-C again "
                  "kills them now)", flush=True)
        if redis_url is not None:
            with contextlib.suppress(Exception):  # the counts are a report, not the run
                groups = group_counts(redis_url)
    finally:
        procs.stop_all()
        signal.signal(signal.SIGTERM, previous_sigterm)
    return _result(cfg, work, metrics, groups, time.monotonic() - t0, interrupted)


def _say_settings(cfg: UpConfig) -> None:
    """The run's settings: all of them in ``run_dir/up_config.json``, the main ones here."""
    from gspo_rl.logs import config_dump

    path = cfg.run_dir / "up_config.json"
    path.write_text(config_dump(cfg) + "\n")
    print(f"gspo up: {cfg.loss}, lr {cfg.learning_rate:g}, {cfg.groups_per_step} groups/step, "
          f"max staleness {cfg.max_staleness}, target {cfg.target_reward or 'none'}, "
          f"{cfg.minutes:g} min max (all settings: {path})", flush=True)


def _result(cfg: UpConfig, work: Workload, metrics: Path, groups: dict[str, int] | None,
            seconds: float, interrupted: bool) -> UpResult:
    records = step_records(read_metrics(metrics))
    env_records = read_metrics(cfg.run_dir / "env_rewards.jsonl")
    sampled = version_curve(env_records)
    plot = plot_rewards(records, sampled, cfg.run_dir / "reward_curve.png",
                        f"gspo up: {cfg.loss} on {work.title}")
    rewards = [float(r["reward_mean"]) for r in records if "reward_mean" in r]
    reached = None
    if cfg.target_reward is not None:
        env = [float(r["reward"]) for r in env_records]
        reached = len(env) >= ENV_WINDOW and any(
            m >= cfg.target_reward for m in moving(env, ENV_WINDOW)[ENV_WINDOW - 1:])
    return UpResult(steps=len(records), rewards=rewards, sampled=sampled,
                    seconds=seconds, metrics_path=metrics, plot_path=plot,
                    target_reached=reached, groups=groups, workload=work.summary(),
                    interrupted=interrupted)
