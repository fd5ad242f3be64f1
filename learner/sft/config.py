"""``gspo sft``'s configuration: one typed model, like ``LearnerConfig`` (loadable from TOML,
overridable by the flags a user passed; invalid values fail at construction, naming the
field). The optimiser, runtime and tracking fields are the learner's own (the shared models of
``gspo_rl.learner.config``): ``learner_config`` hands them to the learner's ``Trainer``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from gspo_rl.learner.config import (
    LearnerConfig,
    OptimizerFields,
    RuntimeFields,
    TrackingFields,
)


class SFTConfig(OptimizerFields, RuntimeFields, TrackingFields):
    """A supervised warm start on chat demonstrations. Field docstrings are the reference."""

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

    lr_schedule: Literal["constant", "cosine"] = "cosine"
    """After warm-up: constant, or a cosine decay to 0 at the last step."""

    save_every: int = Field(default=100, ge=1)
    """Checkpoint every k steps, and at the end (and on a stop signal)."""
    keep_last: int = Field(default=2, ge=1)
    """Checkpoints kept on disk."""
    resume: bool = False
    """Continue from the newest checkpoint of this ``gspo sft`` run in ``save_dir``."""

    metrics_jsonl: str | None = None
    """One JSON line per step here (default: ``save_dir/metrics.jsonl``)."""

    @field_validator("chat_template_kwargs", mode="before")
    @classmethod
    def _json_object(cls, v: Any) -> Any:
        return json.loads(v) if isinstance(v, str) else v

    @property
    def metrics_path(self) -> Path:
        return Path(self.metrics_jsonl) if self.metrics_jsonl else \
            Path(self.save_dir) / "metrics.jsonl"

    def learner_config(self) -> LearnerConfig:
        """The learner configuration its ``Trainer`` and trackers read: this run's optimiser,
        runtime and tracking fields (the RL fields keep their defaults and are unused)."""
        shared = ["model", *OptimizerFields.model_fields, *RuntimeFields.model_fields,
                  *TrackingFields.model_fields]
        return LearnerConfig(weight_sync="none", console=False,
                             metrics_jsonl=str(self.metrics_path),
                             **{k: getattr(self, k) for k in shared})
