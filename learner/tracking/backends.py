"""The trackers (``BACKENDS``): TensorBoard, Weights & Biases, MLflow and the Prometheus exporter
(``prometheus``), each opened with the run's ``RunInfo`` and then given scalars at a step and
tables of sampled episodes (``gspo_rl.learner.tracking.base``, ``.samples``).

Where each writes: TensorBoard event files in ``<directory>/tensorboard`` (a resumed run
purges the events after its checkpoint's step, so the curves continue the trained history);
W&B wherever its own settings say (``WANDB_MODE=offline``: a run directory under
``<directory>/wandb``, ``wandb sync`` uploads it later); MLflow to ``MLFLOW_TRACKING_URI``,
else a SQLite database ``<directory>/mlflow.db``. W&B and MLflow start a new run per process:
a resumed learner's run says ``resumed_from`` and its steps continue the checkpoint's.
Sample tables: TensorBoard text ``samples`` (a Markdown table), a W&B table ``samples``, an
MLflow artifact ``samples/step_<step>.json`` (``{"step", "columns", "rows"}``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from gspo_rl.learner.tracking.base import Backend, RunInfo, Tracker, check_installed
from gspo_rl.learner.tracking.prometheus import PrometheusBackend
from gspo_rl.learner.tracking.samples import markdown_table

log = logging.getLogger(__name__)
DEFAULT_PROJECT = "gspo-rl"


def flat_config(obj: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``{"loss": {"kind": "gspo"}}`` -> ``("loss.kind", "gspo")``: nested keys joined by
    dots, leaves as they are."""
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flat_config(value, name + ".")
        else:
            yield name, value


class TensorBoardBackend:
    name = "tensorboard"

    def __init__(self, info: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = info.first_step + 1 if info.first_step else None
        self.writer = SummaryWriter(str(info.directory / "tensorboard"), purge_step=purge)
        text = json.dumps({"config": info.config, "tags": info.tags}, indent=1, default=str)
        self.writer.add_text("run", f"```\n{text}\n```", info.first_step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.writer.add_text("samples", markdown_table(rows), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbBackend:
    name = "wandb"

    def __init__(self, info: RunInfo) -> None:
        import wandb

        project = info.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        self.run = wandb.init(
            project=project, name=info.name, dir=str(info.directory),
            config={**info.config, **info.tags}, tags=[info.tags.get("kind", "learn")],
            reinit="create_new", settings=wandb.Settings(console="off", silent=True))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        import wandb

        columns = list(rows[0])
        table = wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])  # type: ignore[arg-type]  # wandb: list[str | int] (invariant)
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


_MLFLOW_BAD = re.compile(r"[^/\w.\- :]")


def mlflow_key(name: str) -> str:
    """A metric or param name MLflow accepts (``pass@1`` -> ``pass_1``)."""
    return _MLFLOW_BAD.sub("_", name)[:250]


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


class MlflowBackend:
    name = "mlflow"

    def __init__(self, info: RunInfo) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or \
            f"sqlite:///{(info.directory / 'mlflow.db').resolve()}"
        self.client = MlflowClient(uri)
        name = info.project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        found = self.client.get_experiment_by_name(name)
        artifacts = None if "MLFLOW_TRACKING_URI" in os.environ else \
            (info.directory / "mlflow-artifacts").resolve().as_uri()
        exp_id = found.experiment_id if found is not None else \
            self.client.create_experiment(name, artifact_location=artifacts)
        self.run_id = self.client.create_run(exp_id, run_name=info.name,
                                             tags=info.tags).info.run_id
        params = [Param(mlflow_key(k), str(v)[:6000]) for k, v in flat_config(info.config)]
        for part in _chunks(params, 100):
            self.client.log_batch(self.run_id, params=part)

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        batch = [Metric(mlflow_key(k), v, ms, step) for k, v in metrics.items()]
        for part in _chunks(batch, 1000):
            self.client.log_batch(self.run_id, metrics=part)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        table = {"step": step, "columns": list(rows[0]), "rows": rows}
        self.client.log_dict(self.run_id, table, f"samples/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


BACKENDS: dict[str, Callable[[RunInfo], Backend]] = {
    "tensorboard": TensorBoardBackend, "wandb": WandbBackend, "mlflow": MlflowBackend,
    "prometheus": PrometheusBackend}


def open_tracker(names: Sequence[str], info: RunInfo) -> Tracker | None:
    """A ``Tracker`` over the named backends (None when there are none). Checks that each is
    installed first (``TrackingUnavailable``); a backend that fails to open raises."""
    if not names:
        return None
    check_installed(names)
    info.directory.mkdir(parents=True, exist_ok=True)
    opened: list[Backend] = []
    try:
        for name in names:
            opened.append(BACKENDS[name](info))
    except BaseException:
        Tracker(opened).close()
        raise
    log.info("tracking to %s (local files under %s)", ", ".join(names), info.directory)
    return Tracker(opened)
