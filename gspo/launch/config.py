"""``UpConfig``: the settings of one ``gspo up`` run (its flags, a ``--config`` TOML file, the
Python API's ``start_up``), torch-free."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gspo_rl.learner.tracking.base import TrackerNames

UP_DEFAULTS: dict[str, Any] = {"run_dir": "runs/up"}
"""Where ``gspo up`` (the command) differs from ``UpConfig``'s own defaults."""

# The demo's learning rate with LoRA adapters (alpha 16): measured in docs/lora.md.
LORA_LR = 1e-2


class UpConfig(BaseModel):
    """Settings of one ``gspo up`` run (the CLI's flags). A pydantic model like
    ``ServerSettings`` and ``LearnerConfig``: typed, validated, one docstring per field."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    # ---------------------------------------------------------------- what to train on
    model: str | None = None
    """Model directory; None: make a tiny model in the run directory."""
    tasks: str | None = None
    """Train on tasks from data: a task file (TOML or YAML; docs/tasks.md,
    ``gspo_rl.client.tasks``), or ``reasoning-gym:NAME[:weight],...``; None: the alphabet demo
    (or ``env``)."""
    env: list[str] = Field(default_factory=list)
    """Train on an environment, ``SPEC[@WEIGHT]`` (repeatable: several run side by side, drawn
    by weight): ``path/to/my_env.py:MyEnv`` | ``package.module:MyEnv`` | ``verifiers:MODULE`` |
    ``reasoning-gym:NAME,...`` | ``openenv:URL`` | ``textarena:GAME_ID``
    (docs/environments/index.md)."""
    env_args: list[str] = Field(default_factory=list)
    """An environment's argument, ``key=value`` (JSON value; dotted keys nest), repeatable;
    ``NAME:key=value`` with several ``env``."""
    data: list[str] = Field(default_factory=list)
    """Train on tasks from these data files (JSONL, JSON, Parquet, datasets directory), instead
    of or overriding the task file's sources."""
    verifier: str | None = None
    """With ``data``: the verifier (default: exact)."""
    group_size: int | None = Field(None, ge=2)
    """Samples per prompt (G); None: the task file's, 8 for the alphabet demo."""
    selection: bool = True
    """Task selection by difficulty (``gspo_rl.client.selection``; docs/learning-signal.md) for
    environments that have it (tasks from data, reasoning-gym): tasks recently solved or failed
    by every sample are drawn less often. False: every task as the source gives it."""
    eval_every: int | None = Field(None, ge=1)
    """Evaluate the task file's eval set every this many versions (default: the file's)."""

    # ---------------------------------------------------------------- the run
    run_dir: Path
    """Where metrics, checkpoints, logs and the reward-curve PNG go (``gspo up``: runs/up)."""
    resume: bool = False
    """Continue the run in ``run_dir`` (its Redis, model, newest checkpoint and settings, those
    of ``run_dir/up_config.json``; settings given again override them) instead of starting
    from scratch."""
    minutes: float = Field(10.0, gt=0)
    """Hard wall-clock limit."""
    max_steps: int = Field(300, ge=1)
    """Most learner steps to train."""
    target_reward: float | None = 0.8
    """Stop once the mean reward of the last 32 sampled groups reaches this (the learner's
    ``target_reward``: the servers start no new group, the groups in flight are trained, the
    learner checkpoints and exits 0, as in docker compose's cpu profile); 0 or None: train for
    ``max_steps``."""
    seed: int = 0
    """Seed of the tiny model, the tasks and the learner."""
    device: str | None = None
    """Device of the server and the learner: cpu | cuda | cuda:N (one GPU: weights pass as CUDA
    IPC handles); None: each picks, CUDA when available."""
    engine: Literal["hf", "vllm"] = "hf"
    """Rollout engine: hf | vllm."""
    redis_url: str | None = None
    """Use this Redis; None: start a redis-server of our own."""

    # ---------------------------------------------------------------- the learner
    loss: Literal["gspo", "gspo_token", "grpo", "sapo"] = "gspo"
    """The objective: gspo | gspo_token | grpo | sapo."""
    lr: float | None = Field(None, gt=0)
    """Learning rate (docs/tuning.md); None: 2e-3 for the tiny demo model, ``LORA_LR`` (1e-2)
    with ``lora_rank``."""
    lora_rank: int | None = Field(None, ge=1)
    """Train LoRA adapters of this rank on the frozen model (the learner's ``lora_rank``;
    docs/lora.md); None: every weight."""
    groups_per_step: int = Field(4, ge=1)
    """Groups per learner step."""
    max_staleness: int = Field(2, ge=0)
    """Drop groups more than this many policy versions old (the learner's
    ``max_staleness``; it also bounds admission)."""
    read_timeout_s: float | None = Field(None, gt=0)
    """The learner's longest wait for a full batch of ``groups_per_step`` before it trains the
    groups it has (the learner's ``read_timeout_s``, 5 s); raise it for an environment that
    finishes fewer groups than that in the time."""

    # ---------------------------------------------------------------- the environment and server
    concurrency: int = Field(4, ge=1)
    """Groups the environment samples at the same time."""
    admission: bool = True
    """The server's admission control (``gspo_rl.server.rollouts.admission``): new groups wait
    while as many are in flight as the learner can train within ``max_staleness``. False: the
    environment runs ahead unbounded (for comparison: stale groups are dropped)."""
    no_signal_hold_s: float | None = Field(None, ge=0)
    """The server's sampling budget (its ``no_signal_hold_s``, 30 s): a group that ends
    without a learning signal counts as in flight until the learner's next step, at most
    this long; 0: it leaves at once."""
    no_signal_drought_s: float | None = Field(None, ge=0)
    """The server's ``no_signal_drought_s`` (180 s): after this long without any group with a
    learning signal, the budget holds every place (sampling slows to a probe); 0: never."""
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """vLLM's share of the GPU when it shares it with the learner."""

    # ---------------------------------------------------------------- tracking
    report_to: TrackerNames = Field(default_factory=list)
    """Experiment trackers the learner reports to, comma-separated: tensorboard, wandb, mlflow
    (the learner's ``report_to``), writing locally under ``run_dir/tracking``
    (docs/tracking.md)."""
    run_name: str | None = None
    """Name of the tracked run; None: the tracker picks one."""
    tracking_project: str | None = None
    """W&B project and MLflow experiment; None: theirs from the environment, else "gspo-rl"."""

    # ---------------------------------------------------------------- the Python API only
    extra_learn_args: list[str] = Field(default_factory=list)
    """More ``gspo learn`` flags for the learner process."""
    cpus: dict[str, list[int]] = Field(default_factory=dict)
    """Pin child processes to CPU cores by name ("server", "learner", "redis"), their torch
    threads to as many (``OMP_NUM_THREADS``): each side gets its own cores, as on separate
    devices (``benchmarks/bench_async.py``). Empty (default): no pinning."""

    @field_validator("env")
    @classmethod
    def _env_specs(cls, env: list[str]) -> list[str]:
        """Each spec well formed, its weight a finite number > 0 (nothing is loaded here)."""
        from gspo_rl.client.loading import parse_spec

        for spec in env:
            parse_spec(spec)
        return env

    @model_validator(mode="after")
    def _env_args_addressed(self) -> UpConfig:
        """``env_args`` go with an environment, each ``key=value`` addressed to one of them
        (``NAME:key=value`` with several; ``tasks`` reasoning-gym counts as one)."""
        from gspo_rl.client.loading import parse_spec, with_args

        specs = list(self.env)
        if self.tasks is not None and self.tasks.startswith("reasoning-gym:"):
            specs.insert(0, self.tasks)
        if self.env_args and not specs:
            raise ValueError("env_args (--env-arg) go with env (--env): they are its arguments")
        if self.env_args:
            with_args([parse_spec(s) for s in specs], list(self.env_args))
        return self

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
