"""A task configuration: sources, verifier, sampling, multi-turn and evaluation, in one file.

``TaskConfig.load("tasks.toml")`` (or ``.yaml`` / ``.yml`` with the ``yaml`` extra); paths in
the file are relative to it. ``TaskConfig.from_options(data=..., verifier=...)`` builds the
one-source configuration that ``gspo env data --data ... --verifier ...`` uses. Every field
is documented below and in docs/tasks.md; unknown keys are refused (a typo would silently
change what is trained).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class SamplingConfig(_Model):
    """Sampling settings of every request (None: the server's default)."""

    temperature: float = Field(1.0, ge=0.0, le=2.0)
    """0 (greedy) only for evaluation: training requests must sample."""
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    max_tokens: int = Field(64, ge=1)
    stop: list[str] | None = None

    def body(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class VerifierConfig(BaseModel):
    """``kind`` and that verifier's options (``gspo_rl.client.verifiers``)."""

    model_config = ConfigDict(extra="allow")

    kind: str = "exact"
    """exact | normalized | numeric | math | regex | json_schema | python."""

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class SourceConfig(_Model):
    """One data file (or datasets directory) of tasks."""

    path: str
    """JSONL, JSON, Parquet, or a directory saved by datasets (relative to the config)."""
    name: str | None = None
    """The source's name in metrics (default: the file's stem)."""
    split: str | None = None
    """A split of a datasets directory that holds several."""
    weight: float = Field(1.0, gt=0)
    """Share of the tasks drawn from this source, relative to the others."""
    epochs: int | None = Field(None, ge=1)
    """Passes over this source (default: the configuration's ``epochs``)."""
    limit: int | None = Field(None, ge=1)
    """Use only the first ``limit`` records."""
    prompt_field: str | None = None
    """The prompt's field (default: the first of messages, prompt, question, problem, input)."""
    answer_field: str | None = None
    """The reference answer's field (default: answer, reference, target, solution, output)."""
    id_field: str | None = None
    template: str | None = None
    """A prompt built from the record's fields: ``"Q: {question}\\nA:"``."""


class MultiTurnConfig(_Model):
    """Retry with feedback: a wrong answer gets ``feedback`` and another attempt."""

    max_attempts: int = Field(2, ge=1, le=16)
    feedback: str = "That is not correct. Try again."
    discount: float = Field(1.0, gt=0, le=1)
    """The reward of a right answer at attempt i (from 0) is discount ** i."""


class EvalConfig(_Model):
    """A held-out set, run every ``every`` policy versions with its own sampling."""

    sources: list[SourceConfig] = Field(min_length=1)
    name: str = "eval"
    """Its name in the metrics: ``eval/<name>/pass@k``."""
    every: int = Field(10, ge=1)
    """Run at the first version seen, then every this many versions."""
    samples: int = Field(4, ge=1)
    """Answers per task (n); pass@k for every k in ``k`` up to it."""
    k: list[int] = Field(default_factory=lambda: [1])
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    limit: int | None = Field(None, ge=1)
    """Evaluate only the first ``limit`` tasks."""
    concurrency: int = Field(8, ge=1)

    @model_validator(mode="after")
    def _k_fits(self) -> EvalConfig:
        if any(k < 1 or k > self.samples for k in self.k):
            raise ValueError(f"every k must be in [1, samples={self.samples}], got {self.k}")
        return self


class SelectionConfig(_Model):
    """Task selection by difficulty (``gspo_rl.client.selection``): tasks whose recent groups
    were solved (or failed) by every sample are drawn less often."""

    enabled: bool = True
    streak: int = Field(1, ge=1)
    """Groups in a row with every sample equal that put a task in a band without signal."""
    solved_reward: float = 1.0
    """Every sample at or above this: solved."""
    failed_reward: float = 0.0
    """Every sample at or below this: failed."""
    revisit: float = Field(0.1, ge=0, le=1)
    """The chance that such a task is played when drawn (it comes back once learnable)."""
    max_draws: int = Field(8, ge=1)
    """Draws before the last one is kept whatever its band."""


class TaskConfig(_Model):
    """Tasks from data: where they come from, how they are asked and checked."""

    name: str = "tasks"
    sources: list[SourceConfig] = Field(min_length=1)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    group_size: int = Field(8, ge=2)
    """Samples (episodes) per task: one group."""
    epochs: int | None = Field(None, ge=1)
    """Passes over every source (None: forever)."""
    shuffle: bool = True
    seed: int = 0
    system_prompt: str | None = None
    """Put first in every chat prompt."""
    prompt_format: Literal["chat", "text"] = "chat"
    """chat: the model's chat template over the messages; text: the prompt as raw text."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    multi_turn: MultiTurnConfig | None = None
    eval: EvalConfig | None = None
    selection: SelectionConfig = Field(default_factory=SelectionConfig)

    @classmethod
    def load(cls, path: str | Path, **overrides: Any) -> TaskConfig:
        """A TOML or YAML file; its relative paths resolved against its folder."""
        p = Path(path).expanduser()
        text = p.read_text(encoding="utf-8")
        if p.suffix.lower() in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as exc:
                raise ImportError("YAML task configurations need pyyaml: pip install "
                                  "'gspo-rl-client[yaml]' (TOML needs nothing)") from exc
            data = yaml.safe_load(text)
        else:
            data = tomllib.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{p}: a task configuration is a table of settings")
        cfg = cls.model_validate({**data, **overrides})
        return cfg.relative_to(p.parent)

    @classmethod
    def from_options(cls, data: list[str], verifier: str = "exact",
                     eval_data: list[str] | None = None, **fields: Any) -> TaskConfig:
        """One configuration from flags: data files, a verifier kind, an eval set."""
        cfg: dict[str, Any] = {"sources": [{"path": d} for d in data],
                               "verifier": {"kind": verifier}, **fields}
        if eval_data:
            cfg["eval"] = {"sources": [{"path": d} for d in eval_data]}
        return cls.model_validate(cfg)

    def relative_to(self, folder: Path) -> TaskConfig:
        def fix(s: SourceConfig) -> SourceConfig:
            p = Path(s.path).expanduser()
            return s.model_copy(update={"path": str(p if p.is_absolute() else folder / p)})

        update: dict[str, Any] = {"sources": [fix(s) for s in self.sources]}
        if self.eval is not None:
            update["eval"] = self.eval.model_copy(
                update={"sources": [fix(s) for s in self.eval.sources]})
        opts = self.verifier.options()
        for key in ("schema_file", "function"):
            value = opts.get(key)
            if isinstance(value, str) and (key == "schema_file" or value.split(":")[0]
                                           .endswith(".py")):
                where, sep, name = value.rpartition(":") if key == "function" else (
                    value, "", "")
                p = Path(where).expanduser()
                p = p if p.is_absolute() else folder / p
                opts[key] = f"{p}{sep}{name}"
        update["verifier"] = VerifierConfig(kind=self.verifier.kind, **opts)
        return self.model_copy(update=update)
