"""The learner's configuration: one typed model, loadable from TOML, overridable from the CLI.

Precedence, lowest first: field defaults, the TOML file, keyword overrides (the CLI flags a
user actually passed; ``None`` means "not passed"). Invalid values fail at construction with a
pydantic ``ValidationError`` that names the field, before any model or Redis connection.

TOML layout: top-level keys are the fields below; the loss is a ``[loss]`` table
(``kind = "gspo"``, ``clip_low = ...``). A CLI ``--loss grpo`` override changes only
``loss.kind`` and keeps the other keys of the table.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from gspo_rl.contract.schema import DEFAULT_PREFIX
from gspo_rl.learner.algorithm.config import LossConfig
from gspo_rl.learner.tracking.base import TrackerNames

OldLogprobsMode = Literal["auto", "behavior", "recompute"]
# Every attention and MLP projection of Llama / Qwen / Mistral-style decoder layers.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class _Fields(BaseModel):
    """A frozen config model whose field docstrings are the reference, loaded by ``from_toml``
    (the one loader of the learner's and SFT's configs)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    @classmethod
    def from_toml(cls, path: str | Path | None = None, **overrides: Any) -> Self:
        """Fields from the TOML file at ``path`` (optional), then ``overrides`` that are not
        ``None``. ``loss`` may be overridden by a kind string or a dict of loss fields."""
        data: dict[str, Any] = {}
        if path is not None:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        return cls.model_validate(merge_overrides(data, overrides))


class OptimizerFields(_Fields):
    """AdamW and its schedule, as the learner's ``Trainer`` builds them: the fields the
    learner (``LearnerConfig``) and the supervised warm start (``SFTConfig``) share."""

    # ---------------------------------------------------------------- optimiser
    lr: float = Field(default=1e-5, gt=0.0)
    """AdamW learning rate (after warm-up). The default moves a small (~1B) model within tens
    of steps; large models usually want 1e-6, the tiny demo model 2e-3 (``gspo up``)."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear learning-rate warm-up, in optimizer steps; 0 (the default): no warm-up."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW decoupled weight decay; 0 (the default): none."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2)."""
    adam_eps: float = Field(default=1e-8, gt=0.0)
    """AdamW epsilon."""
    grad_clip: float | None = Field(default=1.0, gt=0.0)
    """Max global gradient norm per optimizer step; ``None`` disables clipping."""


class RuntimeFields(_Fields):
    """Where and how the model runs (device, precision, packing, compilation, seed): the
    fields ``LearnerConfig`` and ``SFTConfig`` share."""

    # ---------------------------------------------------------------- runtime
    micro_batch_tokens: int = Field(default=16384, ge=1)
    """Token budget of one forward/backward: rows x longest row when padded, the sum of the
    lengths when packed; gradients of the microbatches of a minibatch accumulate. Bounds
    activation memory, not the maths."""
    device: str = "auto"
    """"auto" (CUDA when available, else CPU), "cpu", "cuda", "cuda:1", ..."""
    gradient_checkpointing: bool | None = None
    """Recompute activations in backward (less memory, ~30% more compute). ``None``: chosen
    by size on CUDA (``gspo_rl.learner.model.speed.needs_checkpointing``), off on the CPU."""
    param_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Parameter dtype. "bfloat16": bf16 weights and activations, float32 master weights and
    AdamW state held by the optimizer (``gspo_rl.learner.model.precision``). "auto": bfloat16 on
    CUDA (unless FSDP2-sharded), float32 on the CPU (exact)."""
    packing: Literal["auto", "on", "off"] = "auto"
    """Run each microbatch as one packed row (no padding, variable-length attention;
    ``gspo_rl.learner.data.packing``); ``micro_batch_tokens`` then counts real tokens.
    "auto": on CUDA."""
    compile: Literal["auto", "on", "off"] = "auto"
    """``torch.compile`` each decoder layer (fuses the norms, rotary embeddings and MLP
    activations; the attention stays eager). "auto": on CUDA with bf16 parameters, where it
    measured 1.2-1.3x the tokens/s (BENCHMARKS.md), off on the CPU; a layer that fails to
    compile runs eagerly (logged). The first steps pay for the compilation (tens of seconds).
    ``true``/``false`` are read as "on"/"off"."""

    seed: int = 0
    """Seeds torch, numpy and random at start (restored from the checkpoint on resume)."""

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_bool(cls, v: Any) -> Any:
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


class TrackingFields(_Fields):
    """The experiment trackers a run reports to: the fields ``LearnerConfig`` and
    ``SFTConfig`` share."""

    # ---------------------------------------------------------------- metrics
    report_to: TrackerNames = Field(default_factory=list)
    """Experiment trackers that get the run's config and git commit, then every record of the
    metrics JSONL (steps, stalls, checkpoints, evaluations): any of tensorboard, wandb,
    mlflow, prometheus (an exporter at ``prometheus_port``), comma-separated on the command
    line. Each of the first three is an extra (``pip install 'gspo-rl[wandb]'``); a missing one
    stops the start with that hint (docs/tracking.md). Default: none (no tracker)."""
    run_name: str | None = None
    """Name of the tracked run (W&B, MLflow); ``None``: the tracker picks one."""
    tracking_project: str | None = None
    """W&B project and MLflow experiment; ``None``: env WANDB_PROJECT /
    MLFLOW_EXPERIMENT_NAME, else "gspo-rl"."""
    tracking_dir: str | None = None
    """Where trackers write locally (TensorBoard events, W&B's run directories, the MLflow
    SQLite database unless MLFLOW_TRACKING_URI is set); ``None``: ``tracking`` beside the
    metrics JSONL (``runs/tracking`` without one)."""


class LearnerConfig(OptimizerFields, RuntimeFields, TrackingFields):
    """Everything the learner process needs. Field docstrings are the reference."""

    # ---------------------------------------------------------------- model and wiring
    model: str
    """Path of the Hugging Face model directory to start from (or resume's fallback)."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis holding the ready-group stream, the counters and the learner state."""
    key_prefix: str = DEFAULT_PREFIX
    """Prefix of every Redis key (``gspo_rl.contract.schema.Keys``); must match the
    servers'."""
    consumer: str = "learner-0"
    """Consumer name in the Redis consumer group; keep it stable across restarts."""

    # ---------------------------------------------------------------- the objective
    loss: LossConfig = Field(default_factory=LossConfig)
    """The objective (``kind`` gspo | gspo_token | grpo | sapo) and its constants."""
    old_logprobs: OldLogprobsMode = "auto"
    """pi_old: "behavior" clips around the servers' sampling logprobs (paper 5.4, no extra
    pass); "recompute": the decoupled objective, which clips around pi_prox (recomputed with
    the weights before the step's first update) and corrects from the sampler with a truncated
    importance weight, per sequence for gspo, per token otherwise. "auto" (default):
    "recompute" unless ``max_staleness`` is 0. Why: stale groups are far outside GSPO's narrow
    band around the sampler's ratio (about half their tokens were clipped at staleness 3, so
    not learned from), while the extra forward pass costs ~1/3 of a step; with 0 the sampler's
    weights are the proximal policy (docs/reference/losses.md)."""
    is_weight_cap: float = Field(default=2.0, gt=0.0)
    """Truncation C of the recompute-mode importance weight ``min(pi_prox / pi_behavior, C)``
    (the ratio is the geometric mean over the sequence's tokens for gspo)."""
    max_staleness: int | None = Field(default=2, ge=0)
    """Groups whose oldest token is more than this many policy versions old are dropped
    (counted). It also bounds the servers' admission control: they hold new groups while
    ``(max_staleness + 1) x groups_per_step`` are in flight. 0: synchronous training. 2 (the
    default, as ``gspo up``): unbounded runs trained on groups ~100 versions old and learned
    slower (docs/concepts/staleness.md). ``None`` (Python only) turns both mechanisms off."""

    # ---------------------------------------------------------------- batching
    groups_per_step: int = Field(default=8, ge=1)
    """Groups read from the queue per training step (one policy version per step)."""
    keep_trained_s: int = Field(default=600, ge=0)
    """Seconds a trained group's rollout records stay in Redis after its stream entry is trimmed
    (``GET /v1/groups/{id}?include=tokens`` reads them); 0 deletes them with the entry. Redis
    holds about this many seconds of trained rollouts."""
    minibatches: int = Field(default=1, ge=1)
    """The step's batch is split into this many minibatches; each is one optimizer step.
    With 1 (and 1 epoch) in "recompute" mode the only update starts at pi_prox: every ratio
    is exactly 1 and the clip never acts (``clip_inactive``; docs/reference/losses.md)."""
    epochs: int = Field(default=1, ge=1)
    """Passes over the step's minibatches (PPO's epochs): ``minibatches x epochs`` optimizer
    steps per policy version, each pass in the same order."""

    # ---------------------------------------------------------------- LoRA
    lora_rank: int | None = Field(default=None, ge=1)
    """Train LoRA adapters of this rank (PEFT) on a frozen base instead of every weight;
    ``None``: full fine-tuning. Checkpoints then hold the adapter in PEFT's format and pushes
    send only the adapter tensors (docs/lora.md)."""
    lora_alpha: float = Field(default=16.0, gt=0.0)
    """LoRA scaling numerator: the update is ``(lora_alpha / lora_rank) * B @ A``."""
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapters' input in training passes. Keep 0 for RL: the importance ratio
    compares the learner's function with the sampler's, which has no dropout."""
    lora_target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS))
    """Module names the adapters wrap (comma-separated on the command line); default every
    attention and MLP projection of Llama/Qwen-style models."""

    @field_validator("lora_target_modules", mode="before")
    @classmethod
    def _targets(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [t.strip() for t in v.split(",") if t.strip()]
        if isinstance(v, list | tuple) and not v:
            raise ValueError("lora_target_modules needs at least one module name")
        return v

    # ---------------------------------------------------------------- runtime
    bf16_autocast: bool = False
    """On CUDA, run forward passes under bf16 autocast (weights and optimiser stay float32)."""
    data_parallel: Literal["auto", "allreduce", "fsdp2"] = "auto"
    """Under ``torchrun`` with several ranks: "allreduce" keeps a full replica per rank and
    sums gradients; "fsdp2" shards weights, gradients and optimiser state
    (``gspo_rl.learner.parallel.fsdp``; with ``lora_rank``: the frozen base sharded, the
    adapters trained); "auto" is fsdp2 on CUDA, allreduce on CPU, and allreduce with
    ``lora_rank`` (a replica per rank keeps bf16 weights and packing; ask for fsdp2 when the
    base does not fit one device). Ignored by one process."""
    max_steps: int | None = Field(default=None, ge=1)
    """Stop after this many training steps (counting steps before a resume). ``None``: never."""
    target_reward: float | None = Field(default=None, ge=0.0)
    """Stop once the environment's mean reward over its last ``target_window`` finished groups
    (every group it scored, trained or dropped for equal rewards) reaches this: the task is
    learned. The servers then start no new group, the groups in flight are trained, a
    checkpoint is saved and the learner returns (``gspo learn`` exits 0;
    ``gspo_rl.learner.runtime.target``).
    ``None`` or 0: no target (train until ``max_steps`` or a signal)."""
    target_window: int = Field(default=32, ge=1)
    """Groups the ``target_reward`` mean is taken over (finished since this learner started)."""
    drain_timeout_s: float = Field(default=60.0, gt=0.0)
    """After the target is reached: the longest the learner waits for the groups still in
    flight to be trained before it stops (an abandoned group counts until it expires)."""
    read_timeout_s: float = Field(default=5.0, gt=0.0)
    """Longest wait for a full batch; a partial batch after it is trained as it is, an empty
    one is waited for again (the loop checks for a stop signal between waits)."""

    redis_retry_s: float = Field(default=120.0, gt=0.0)
    """How long the learner keeps retrying (with back-off) while Redis does not answer; then
    it exits with code 75 (``gspo learn``) so a supervisor restarts it."""

    # ---------------------------------------------------------------- checkpoints and sync
    save_dir: str | None = None
    """Checkpoint directory (Hugging Face format per step). ``None``: no checkpoints, and
    groups are acknowledged right after training (at-least-once is then lost on a crash)."""
    save_every: int = Field(default=50, ge=1)
    """Checkpoint every k steps (and on a graceful stop); acks follow each checkpoint."""
    save_every_s: float | None = Field(default=120.0, gt=0.0)
    """Also checkpoint when this many seconds have passed since the last one (None: by
    steps only). Bounds what a crash costs: the unsaved steps' groups are redelivered and
    trained again, but only those sampled within ``max_staleness`` of the checkpoint."""
    keep_last: int = Field(default=3, ge=1)
    """Checkpoints kept on disk; older ones are deleted after a new one is durable."""
    resume: bool = False
    """Resume from the newest complete checkpoint in ``save_dir`` (fresh start if none)."""
    sync_every: int = Field(default=1, ge=1)
    """Push weights to the rollout servers every k steps."""
    weight_sync: Literal["none", "broadcast"] = "broadcast"
    """"broadcast": push to every live registered server (``gspo_rl.learner.weights.broadcast``;
    none registered: nothing to send); "none": servers keep their weights (offline training,
    tests): a loud warning at start and on every step line while servers are registered."""
    admin_key: SecretStr | None = None
    """Bearer key of the servers' admin routes (``gspo learn`` reads env GSPO_ADMIN_KEY)."""
    sync_backend: Literal["gloo", "nccl"] = "gloo"
    """torch.distributed backend of the weight broadcast (nccl when servers are on GPUs). A
    server on the learner's own GPU gets CUDA IPC handles instead, whatever this says."""
    sync_master_addr: str = "127.0.0.1"
    """Address the servers reach the learner's rendezvous store at. Every rank's broadcast
    traffic uses its own address on the route to it (``gspo_rl.contract.weights.collective``)."""
    sync_timeout_s: float = Field(default=60.0, gt=0.0)
    """Bound of every wait of one push (HTTP calls and collectives)."""

    # ---------------------------------------------------------------- metrics
    metrics_jsonl: str | None = None
    """Append one JSON line of metrics per step here (default: ``save_dir/metrics.jsonl``;
    without ``save_dir``: no metrics file, the console line only)."""
    console: bool = True
    """Print one line per step to the terminal."""
    samples_every: int = Field(default=10, ge=0)
    """Every this many steps, the trackers get a table of sampled episodes of the step's
    batch: one per group (at most 8), prompt and completion decoded (the model's turns apart
    from the environment's), reward, advantage, policy versions, staleness, group and task id
    (``gspo_rl.learner.tracking.samples``). 0: none."""
    token_ratios: bool = True
    """After each step, write each trained rollout's per-token log importance ratio
    log(pi_prox / pi_behavior) to Redis (``Keys.token_ratios``, kept as long as its records:
    the dashboard's "importance ratio" shading). Recompute mode only (pi_prox exists there);
    costs one copy to the CPU and one Redis pipeline per step (docs/dashboard.md)."""
    prometheus_port: int = Field(default=9400, ge=0, le=65535)
    """Port of the ``prometheus`` tracker's exporter (``/metrics`` on every interface; 0: a
    free port)."""
    final_eval_wait_s: float = Field(default=0.0, ge=0.0)
    """After training: wait up to this long for the evaluation of the final weights, posted
    by an environment, and log it to the metrics and trackers before exiting (``gspo up``
    sets it when it evaluates; ``gspo_rl.learner.runtime.final_eval``). 0: exit at once."""

    @model_validator(mode="after")
    def _check(self) -> LearnerConfig:
        if self.resume and self.save_dir is None:
            raise ValueError("resume=True needs save_dir")
        return self

    @property
    def pi_old(self) -> Literal["behavior", "recompute"]:
        """``old_logprobs`` with "auto" resolved: "recompute" unless ``max_staleness`` is 0."""
        if self.old_logprobs != "auto":
            return self.old_logprobs
        return "behavior" if self.max_staleness == 0 else "recompute"

    @property
    def clip_inactive(self) -> str | None:
        """Why the loss's clip can never act under this schedule, or None when it can."""
        if self.pi_old == "recompute" and self.minibatches == 1 and self.epochs == 1:
            return ("one minibatch and one epoch per step: the update starts at pi_prox, every "
                    "ratio is 1 and nothing is clipped (--minibatches or --epochs above 1 "
                    "makes the trust region act; docs/reference/losses.md)")
        if self.loss.kind == "sapo":
            return "sapo has a soft gate, no hard clip"
        return None

    @property
    def metrics_path(self) -> Path | None:
        if self.metrics_jsonl is not None:
            return Path(self.metrics_jsonl)
        return None if self.save_dir is None else Path(self.save_dir) / "metrics.jsonl"

    @property
    def tracking_path(self) -> Path:
        if self.tracking_dir is not None:
            return Path(self.tracking_dir)
        metrics = self.metrics_path
        return (metrics.parent if metrics is not None else Path("runs")) / "tracking"


def merge_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``data`` updated with the non-``None`` overrides; a loss override merges into the table."""
    out = dict(data)
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "loss":
            table = dict(out.get("loss") or {})
            table.update({"kind": value} if isinstance(value, str) else dict(value))
            out["loss"] = table
        else:
            out[key] = value
    return out
