"""Experiment tracking: the trackers by name, the installed check, records as scalars, and the
fan-out (``Tracker``) the metrics logger sends every record, and every table of sampled
episodes (``samples``), through (``backends.open_tracker`` opens one).

A record is what the learner writes to its metrics JSONL: a step (``{"event": "step", ...}``),
a stall, a checkpoint, an evaluation, the start and the stop. ``flatten`` turns one into
scalars named ``<namespace>/<field>``: the namespace is the record's ``event`` (``step`` is
``train``), qualified by its ``reason`` when it has one (``stall/no_groups/for_s``); nested
dicts add their keys (``train/staleness/0``, ``eval/math/pass@1``); booleans count as 0/1;
strings, lists and ``None`` are not scalars and are left out (the JSONL keeps them). A
tracker that fails is logged (once per tracker) and never stops training.

Torch-free: the command line checks the trackers before it starts anything.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import BeforeValidator

log = logging.getLogger(__name__)

TrackerName = Literal["tensorboard", "wandb", "mlflow", "prometheus"]
# tracker -> (the modules it needs, the gspo-rl extra that installs them; "": the core install)
REQUIREMENTS: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": (("tensorboard",), "tensorboard"),
    "wandb": (("wandb",), "wandb"),
    "mlflow": (("mlflow", "sqlalchemy", "alembic"), "mlflow"),
    "prometheus": (("prometheus_client",), ""),
}
NAMESPACES = {"step": "train"}  # event -> namespace, where they differ
_NOT_METRICS = frozenset({"event", "step", "time", "run_id", "reason"})


class TrackingUnavailable(RuntimeError):
    """A tracker named in ``report_to`` is not installed (the message names the extra)."""


def parse_names(value: Any) -> list[str]:
    """``"wandb, mlflow"`` or ``["wandb", "mlflow"]`` -> ``["wandb", "mlflow"]``: split at
    commas, stripped, duplicates and empty names dropped, order kept."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    out: list[str] = []
    for item in items:
        name = str(item).strip().lower()
        if name and name not in out:
            out.append(name)
    return out


def _names(value: Any) -> Any:
    return parse_names(value) if isinstance(value, str | list | tuple) else value


TrackerNames = Annotated[list[TrackerName], BeforeValidator(_names)]
"""A config's ``report_to``: tracker names, as a list or one comma-separated string."""


def check_installed(names: Iterable[str]) -> None:
    """Raise ``TrackingUnavailable`` naming the extra to install for the first tracker whose
    packages are missing (an unknown name: ``ValueError``)."""
    for name in names:
        if name not in REQUIREMENTS:
            raise ValueError(f"unknown tracker {name!r}: choose from {', '.join(REQUIREMENTS)}")
        modules, extra = REQUIREMENTS[name]
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            package = f"gspo-rl[{extra}]" if extra else "gspo-rl"
            raise TrackingUnavailable(
                f"--report-to {name} needs {', '.join(missing)}, not installed here: "
                f"pip install '{package}'")


def flatten(record: Mapping[str, Any]) -> dict[str, float]:
    """The scalars of one record, named ``<namespace>/<field>`` (see the module docstring)."""
    event = str(record.get("event", "step"))
    namespace = NAMESPACES.get(event, event)
    reason = record.get("reason")
    if isinstance(reason, str) and reason:
        namespace = f"{namespace}/{reason}"
    out: dict[str, float] = {}
    _walk(namespace, {k: v for k, v in record.items() if k not in _NOT_METRICS}, out)
    return out


def _walk(prefix: str, obj: Mapping[str, Any], out: dict[str, float]) -> None:
    for key, value in obj.items():
        name = f"{prefix}/{key}"
        if isinstance(value, bool | int | float):
            out[name] = float(value)
        elif isinstance(value, Mapping):
            _walk(name, value, out)


@dataclass(frozen=True)
class RunInfo:
    """What a tracker is told about the run when it opens."""

    directory: Path  # where trackers write locally
    config: dict[str, Any]  # the run's configuration, JSON-like
    tags: dict[str, str] = field(default_factory=dict)  # git commit, version, run id, kind
    name: str | None = None  # the run's name (None: the tracker picks)
    project: str | None = None  # W&B project, MLflow experiment (None: env, else "gspo-rl")
    first_step: int = 0  # steps done before this process started (a resume)


class Backend(Protocol):
    """One tracker: scalars at a step, tables of sampled episodes (rows of one dict each, the
    same keys in every row: ``gspo_rl.learner.tracking.samples``), then closed."""

    name: str

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


class Tracker:
    """Sends every record to each backend as scalars; a backend that raises is logged once
    and tried again with the next record (training never stops for a tracker)."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        self.backends = list(backends)
        self._failed: set[str] = set()

    def log(self, record: Mapping[str, Any], step: int) -> None:
        """``record``'s scalars at ``step`` (a record without any is not sent)."""
        metrics = flatten(record)
        if not metrics:
            return
        for b in self.backends:
            self._guarded(b, "log", lambda b=b: b.log(metrics, step))

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """A table of sampled episodes at ``step``, to each backend that shows tables."""
        if not rows:
            return
        for b in self.backends:
            if hasattr(b, "log_samples"):
                self._guarded(b, "log samples", lambda b=b: b.log_samples(step, rows))

    def close(self) -> None:
        for b in self.backends:
            self._guarded(b, "close", b.close)
        self.backends = []

    def _guarded(self, backend: Backend, what: str, fn: Any) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a tracker must not stop training
            if backend.name not in self._failed:
                self._failed.add(backend.name)
                log.warning("tracker %s failed to %s (%s: %s); training goes on",
                            backend.name, what, type(exc).__name__, exc)
