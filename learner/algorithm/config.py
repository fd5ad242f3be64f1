"""The loss's configuration, importable without torch (the CLI and the learner's config read
it): which objective, and its constants."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LossKind = Literal["gspo", "gspo_token", "grpo", "sapo"]

_DEFAULT_CLIP: dict[str, tuple[float, float]] = {
    "gspo": (3e-4, 4e-4),  # GSPO paper, section 5
    "gspo_token": (3e-4, 4e-4),
    "grpo": (0.2, 0.27),  # the paper's GRPO baseline
    "sapo": (0.2, 0.27),  # unused by SAPO's soft gate; kept for a uniform config
}


class LossConfig(BaseModel):
    """Which objective to optimise and its constants. Invalid values fail at construction."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: LossKind = "gspo"
    """The objective: "gspo" | "gspo_token" | "grpo" | "sapo"."""
    clip_low: float | None = Field(default=None, gt=0.0, lt=1.0)
    """Lower clip half-width eps_low (ratio floor 1 - eps_low). Default per kind."""
    clip_high: float | None = Field(default=None, gt=0.0)
    """Upper clip half-width eps_high (ratio ceiling 1 + eps_high). Default per kind."""
    tau_pos: float = Field(default=1.0, gt=0.0)
    """SAPO gate temperature for positive advantages."""
    tau_neg: float = Field(default=1.05, gt=0.0)
    """SAPO gate temperature for non-positive advantages."""
    max_log_ratio: float = Field(default=20.0, gt=0.0, le=80.0)
    """Per-token log-ratios are clamped to +-max_log_ratio before exp (float32 overflows ~88)."""

    @model_validator(mode="after")
    def _fill_clip_defaults(self) -> LossConfig:
        low, high = _DEFAULT_CLIP[self.kind]
        if self.clip_low is None:
            object.__setattr__(self, "clip_low", low)
        if self.clip_high is None:
            object.__setattr__(self, "clip_high", high)
        return self

    @property
    def eps_low(self) -> float:
        assert self.clip_low is not None
        return self.clip_low

    @property
    def eps_high(self) -> float:
        assert self.clip_high is not None
        return self.clip_high
