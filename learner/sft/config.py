"""``gspo sft``'s configuration: one typed model, like ``LearnerConfig`` (loadable from TOML,
overridable by the flags a user passed; invalid values fail at construction, naming the
field). The optimiser and device fields mean what the learner's do: ``learner_config`` hands
them to the learner's ``Trainer``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.tracking.base import TrackerName, parse_names


class SFTConfig(BaseModel):
    """A supervised warm start on chat demonstrations. Field docstrings are the reference."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    model: str
    """Hugging Face model directory to start from (its tokenizer's chat template lays out the
    demonstrations)."""
    data: str
    """JSONL file of demonstrations, one ``{"messages": [...], "tools": [...]}`` object per
    line (``tools`` optional): OpenAI chat messages; the loss is on the assistant messages'
    tokens only (docs/sft.md)."""
    save_dir: str
    """Checkpoint directory (the learner's format: ``gspo learn --model`` and ``gspo serve
    --model`` take a checkpoint directory as it is)."""
    epochs: int = Field(default=1, ge=1)
    """Passes over the demonstrations."""
    max_steps: int | None = Field(default=None, ge=1)
    """Stop after this many optimizer steps (``None``: after ``epochs``)."""
    batch_size: int = Field(default=8, ge=1)
    """Demonstrations per optimizer step; the loss is the mean over their assistant tokens."""
    micro_batch_tokens: int = Field(default=16384, ge=1)
    """Token budget of one forward/backward (rows x longest row when padded, the sum of the
    lengths when packed); gradients accumulate over a step's microbatches."""
    max_length: int | None = Field(default=None, ge=2)
    """Demonstrations longer than this many tokens are left out (counted and logged; never
    truncated: a cut conversation teaches an unfinished turn). ``None``: no limit."""
    shuffle: bool = True
    """Shuffle the demonstrations every epoch (seeded by ``seed``)."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra chat-template variables (``{"enable_thinking": false}``), as the chat requests of
    the RL run will send them; a JSON object on the command line."""
    sanitize_control_tokens: bool = True
    """Special tokens spelled inside messages are encoded as text, as the rollout server does
    (its ``sanitize_control_tokens``: keep the two the same)."""

    lr: float = Field(default=1e-5, gt=0.0)
    """AdamW learning rate (after warm-up)."""
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    """After warm-up: constant, or a cosine decay to 0 at the last step."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear learning-rate warm-up, in optimizer steps."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2)."""
    adam_eps: float = Field(default=1e-8, gt=0.0)
    """AdamW epsilon."""
    grad_clip: float | None = Field(default=1.0, gt=0.0)
    """Max global gradient norm per optimizer step; ``None`` disables clipping."""

    device: str = "auto"
    """"auto" (CUDA when available, else CPU), "cpu", "cuda", "cuda:1", ..."""
    param_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """As the learner's: "auto" is bfloat16 with float32 masters on CUDA, float32 on the CPU."""
    packing: Literal["auto", "on", "off"] = "auto"
    """As the learner's: one packed row per microbatch ("auto": on CUDA)."""
    gradient_checkpointing: bool | None = None
    """As the learner's (``None``: chosen by size on CUDA, off on the CPU)."""
    compile: Literal["auto", "on", "off"] = "auto"
    """As the learner's: ``torch.compile`` each decoder layer ("auto": on CUDA with bf16)."""
    seed: int = 0
    """Seeds torch, numpy, random and the shuffle (restored from the checkpoint on resume)."""

    save_every: int = Field(default=100, ge=1)
    """Checkpoint every k steps, and at the end (and on a stop signal)."""
    keep_last: int = Field(default=2, ge=1)
    """Checkpoints kept on disk."""
    resume: bool = False
    """Continue from the newest checkpoint of this ``gspo sft`` run in ``save_dir``."""

    metrics_jsonl: str | None = None
    """One JSON line per step here (default: ``save_dir/metrics.jsonl``)."""
    report_to: list[TrackerName] = Field(default_factory=list)
    """Experiment trackers (tensorboard, wandb, mlflow), as the learner's (docs/tracking.md)."""
    run_name: str | None = None
    """Name of the tracked run."""
    tracking_project: str | None = None
    """W&B project and MLflow experiment (``None``: theirs from the environment, else
    "gspo-rl")."""
    tracking_dir: str | None = None
    """Where trackers write locally (``None``: ``tracking`` beside the metrics JSONL)."""

    @field_validator("report_to", mode="before")
    @classmethod
    def _tracker_names(cls, v: Any) -> Any:
        return parse_names(v) if isinstance(v, str | list | tuple) else v

    @field_validator("chat_template_kwargs", mode="before")
    @classmethod
    def _json_object(cls, v: Any) -> Any:
        return json.loads(v) if isinstance(v, str) else v

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_bool(cls, v: Any) -> Any:
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @property
    def metrics_path(self) -> Path:
        return Path(self.metrics_jsonl) if self.metrics_jsonl else \
            Path(self.save_dir) / "metrics.jsonl"

    def learner_config(self) -> LearnerConfig:
        """The learner configuration its ``Trainer`` and trackers read: this run's optimiser,
        device and tracking fields (the RL fields keep their defaults and are unused)."""
        shared = ("model", "micro_batch_tokens", "lr", "warmup_steps", "weight_decay", "betas",
                  "adam_eps", "grad_clip", "device", "param_dtype", "packing",
                  "gradient_checkpointing", "compile", "seed", "report_to", "run_name",
                  "tracking_project")
        return LearnerConfig(weight_sync="none", console=False,
                             metrics_jsonl=str(self.metrics_path),
                             tracking_dir=self.tracking_dir,
                             **{k: getattr(self, k) for k in shared})

    @classmethod
    def from_toml(cls, path: str | Path | None = None, **overrides: Any) -> SFTConfig:
        """Fields from the TOML file at ``path`` (optional), then the non-``None``
        ``overrides``."""
        data: dict[str, Any] = {}
        if path is not None:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)
