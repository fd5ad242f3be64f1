"""``UpConfig``: the settings of one ``gspo up`` run (its flags, a ``--config`` TOML file, the
Python API's ``start_up``), torch-free."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gspo_rl.learner.tracking.base import TrackerNames

UP_DEFAULTS: dict[str, Any] = {"run_dir": "runs/up"}
"""Where ``gspo up`` (the command) differs from ``UpConfig``'s own defaults."""

# The demo's learning rate with LoRA adapters (alpha 16): measured in docs/lora.md.
LORA_LR = 1e-2


class UpConfig(BaseModel):
    """Settings of one ``gspo up`` run (the CLI's flags). A pydantic model like
    ``ServerSettings`` and ``LearnerConfig``: typed, validated, one docstring per field."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    run_dir: Path
    """Where metrics, checkpoints, logs and the reward curve go."""
    model: str | None = None
    """Model directory; None: make a tiny model in the run directory."""
    redis_url: str | None = None
    """Redis to use; None: start a redis-server of our own."""
    loss: Literal["gspo", "gspo_token", "grpo", "sapo"] = "gspo"
    max_steps: int = Field(300, ge=1)
    groups_per_step: int = Field(4, ge=1)
    group_size: int | None = Field(None, ge=2)
    """Samples per task; None: the task file's, 8 for the alphabet demo."""
    tasks: str | None = None
    """A task file (tasks from data, ``gspo_rl.client.tasks``), or
    ``reasoning-gym:NAME[:weight],...``; None: the alphabet demo (or ``env``)."""
    env: list[str] = Field(default_factory=list)
    """Environments to train on, ``SPEC[@WEIGHT]`` each (several run side by side, drawn by
    weight): ``path/to/my_env.py:MyEnv``, ``package.module:MyEnv``, ``verifiers:MODULE``,
    ``reasoning-gym:NAME,...``, ``openenv:URL`` (``gspo_rl.client.loading``)."""
    env_args: list[str] = Field(default_factory=list)
    """The environments' arguments, ``key=value`` (JSON values; dotted keys nest); with
    several environments ``NAME:key=value``."""
    resume: bool = False
    """Continue the run in ``run_dir`` (its Redis, model and newest checkpoint) instead of
    starting from scratch; its settings are those of ``run_dir/up_config.json`` unless given
    again."""
    data: list[str] = Field(default_factory=list)
    """Tasks from these data files (instead of, or overriding, the task file's sources)."""
    verifier: str | None = None
    """The verifier of ``data`` (default: exact)."""
    eval_every: int | None = Field(None, ge=1)
    """Evaluate the task file's eval set every this many versions (default: the file's)."""
    lr: float | None = Field(None, gt=0)
    """Learning rate; None: 2e-3, or ``LORA_LR`` with ``lora_rank``."""
    lora_rank: int | None = Field(None, ge=1)
    """Train LoRA adapters of this rank (the learner's ``lora_rank``); None: every weight."""
    read_timeout_s: float | None = Field(None, gt=0)
    """The learner's longest wait for a full batch of ``groups_per_step`` before it trains the
    groups it has (the learner's ``read_timeout_s``, 5 s); raise it for an environment that
    finishes fewer groups than that in the time."""
    max_staleness: int = Field(2, ge=0)
    concurrency: int = Field(4, ge=1)
    """Groups sampled at the same time by the environment."""
    minutes: float = Field(10.0, gt=0)
    """Hard wall-clock limit."""
    target_reward: float | None = 0.8
    """Stop once the last 32 sampled groups average this (the learner's ``target_reward``:
    the servers start no new group, the groups in flight are trained, the learner checkpoints
    and exits 0, as in docker compose's cpu profile); None: train for max_steps."""
    seed: int = 0
    device: str | None = None
    """Server and learner device (cpu, cuda, cuda:1); None: theirs."""
    engine: Literal["hf", "vllm"] = "hf"
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """vLLM's share of the GPU when it shares it with the learner."""
    admission: bool = True
    """The server's admission control (``gspo_rl.server.rollouts.admission``): new groups wait while
    as many are in flight as the learner can train within ``max_staleness``. False: the
    environment runs ahead unbounded (for comparison: stale groups are dropped)."""
    selection: bool = True
    """Task selection by difficulty (``gspo_rl.client.selection``) for environments that have
    it (tasks from data, reasoning-gym): tasks recently solved or failed by every sample are
    drawn less often. False: every task as the source gives it."""
    no_signal_hold_s: float | None = Field(None, ge=0)
    """The server's sampling budget (its ``no_signal_hold_s``, 30 s): a group that ends
    without a learning signal counts as in flight until the learner's next step, at most
    this long; 0: it leaves at once."""
    report_to: TrackerNames = Field(default_factory=list)
    """Experiment trackers the learner reports to (tensorboard, wandb, mlflow; the learner's
    ``report_to``), writing locally under ``run_dir/tracking``."""
    run_name: str | None = None
    """Name of the tracked run; None: the tracker picks one."""
    tracking_project: str | None = None
    """W&B project and MLflow experiment; None: theirs from the environment, else "gspo-rl"."""
    extra_learn_args: list[str] = Field(default_factory=list)
    cpus: dict[str, list[int]] = Field(default_factory=dict)
    """Pin child processes to CPU cores by name ("server", "learner", "redis"), their torch
    threads to as many (``OMP_NUM_THREADS``): each side gets its own cores, as on separate
    devices (``benchmarks/bench_async.py``). Empty (default): no pinning."""

    @classmethod
    def from_toml(cls, path: str | Path | None = None, defaults: dict[str, Any] | None = None,
                  **overrides: Any) -> UpConfig:
        """Fields from ``defaults``, then the TOML file at ``path`` (optional), then the
        ``overrides`` that are not None (``gspo up --config``: the flags override the file).
        A ``target_reward`` of 0 means none."""
        data: dict[str, Any] = dict(defaults or {})
        if path is not None:
            with open(path, "rb") as f:
                data.update(tomllib.load(f))
        data.update({k: v for k, v in overrides.items() if v is not None})
        if data.get("target_reward") == 0:
            data["target_reward"] = None
        return cls.model_validate(data)


    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return LORA_LR if self.lora_rank else 2e-3
