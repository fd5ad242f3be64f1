"""Start, watch and stop a run from Python: the whole system (``start_up``), the learner alone
(``start_learner``) or a supervised warm start (``start_sft``), with the CLI's config models.

Each run is a child process (``gspo_rl.launch.child``), as ``gspo up`` / ``gspo learn`` /
``gspo sft`` would be: a notebook's event loop and signal handlers stay its own, and a crash
of the run is not one of the caller. The returned ``Run`` reads the records the run writes
to its metrics JSONL (``records``, ``metrics``), waits for it (``wait``: the run's own result,
``UpResult`` / ``LearnerState`` / ``SFTResult``) and stops it gracefully (``stop``: SIGTERM,
as Ctrl-C; the learner checkpoints and acknowledges first). Runs still going when the
interpreter exits are stopped. ``run_up`` / ``run_learner`` / ``run_sft`` run in the calling
process instead (blocking; signals need the main thread). Guide: docs/python-api.md.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from gspo_rl.launch.runlog import JsonlTail, step_records

log = logging.getLogger(__name__)
Kind = Literal["up", "learn", "sft"]
_PROGRESS_EVERY_S = 30.0  # a wait that lasts says so
_LIVE: weakref.WeakSet[Run] = weakref.WeakSet()


class RunFailed(RuntimeError):
    """The run's process exited with an error (the message ends with its output's tail)."""


class Run:
    """A run in a child process (see the module docstring). Use as a context manager to stop
    it on the way out."""

    def __init__(self, kind: Kind, config: BaseModel, payload: dict[str, Any],
                 metrics_path: Path, log_path: Path | None = None) -> None:
        self.kind, self.config, self.metrics_path = kind, config, metrics_path
        work = Path(tempfile.mkdtemp(prefix=f"gspo-{kind}-"))
        self.log_path = log_path or work / "output.log"
        self._result_path = work / "result.json"
        offset = metrics_path.stat().st_size if metrics_path.exists() else 0
        self._tail = JsonlTail(metrics_path)
        self._tail.offset = offset  # this run's records only (a resumed learner appends)
        self._seen: list[dict[str, Any]] = []
        self._stopped = False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gspo_rl.launch.child"], stdin=subprocess.PIPE,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        request = {"kind": kind, "config": payload, "result": str(self._result_path)}
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request).encode())
        self.process.stdin.close()
        _LIVE.add(self)

    # ---------------------------------------------------------------- state

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    # ---------------------------------------------------------------- watching

    def metrics(self) -> list[dict[str, Any]]:
        """Every record this run has written so far (steps and events), oldest first."""
        self._seen.extend(self._tail.new_records())
        return list(self._seen)

    def steps(self) -> list[dict[str, Any]]:
        """The step records so far (``{"event": "step"}``; ``gspo sft``: ``"sft"``)."""
        recs = self.metrics()
        return [r for r in recs if r.get("event") == "sft"] if self.kind == "sft" \
            else step_records(recs)

    def records(self, follow: bool = True, poll_s: float = 0.5) -> Iterator[dict[str, Any]]:
        """The run's records one by one: those written so far, then (``follow``) each new
        one as it is written, until the run ends."""
        sent = 0
        while True:
            alive = self.running  # read before the file: records written before the exit
            recs = self.metrics()
            yield from recs[sent:]
            sent = len(recs)
            if not follow or not alive:
                return
            time.sleep(poll_s)

    # ---------------------------------------------------------------- ending

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for the run to end and return its result (``None`` if a signal stopped it
        before it had one). ``TimeoutError`` after ``timeout`` seconds (the run goes on);
        ``RunFailed`` when it exited with an error. Logs every 30 s while it waits."""
        start = time.monotonic()
        while True:
            left = None if timeout is None else timeout - (time.monotonic() - start)
            if left is not None and left <= 0:
                raise TimeoutError(f"the {self.kind} run (pid {self.pid}) is still running "
                                   f"after {timeout:.0f} s")
            try:
                self.process.wait(timeout=min(_PROGRESS_EVERY_S, left or _PROGRESS_EVERY_S))
                break
            except subprocess.TimeoutExpired:
                steps = self.steps()
                log.info("waiting for the %s run (pid %d): %.0f s, step %s", self.kind,
                         self.pid, time.monotonic() - start,
                         steps[-1].get("step") if steps else "none yet")
        return self._result()

    def stop(self, timeout: float = 120.0) -> Any:
        """Stop gracefully (SIGTERM, as Ctrl-C: the learner trains its current step,
        checkpoints and acknowledges; ``gspo up`` stops every process it started) and
        return what ``wait`` returns. Killed after ``timeout`` seconds."""
        if self.running:
            self._stopped = True
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.wait(timeout)
            except TimeoutError:
                log.warning("the %s run (pid %d) did not stop within %.0f s: killed",
                            self.kind, self.pid, timeout)
                self.process.kill()
                self.process.wait(30)
        return self._result()

    def _result(self) -> Any:
        code = self.process.returncode
        body = json.loads(self._result_path.read_text()) if self._result_path.exists() else {}
        if code not in (0, 130) and not (self._stopped and code == -signal.SIGTERM):
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RunFailed(f"the {self.kind} run exited with {code}; its output ends:\n{tail}")
        if body.get("interrupted", True) or body.get("result") is None:
            return None
        return _decode(self.kind, body["result"])

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.running:
            self.stop()


def _decode(kind: Kind, data: dict[str, Any]) -> Any:
    """The run's result object from its JSON form."""
    if kind == "up":
        from gspo_rl.launch.up import UpResult

        plot = data.get("plot_path")
        return UpResult(**{**data, "sampled": [tuple(s) for s in data["sampled"]],
                           "metrics_path": Path(data["metrics_path"]),
                           "plot_path": Path(plot) if plot else None})
    if kind == "learn":
        from gspo_rl.learner.checkpoint.store import LearnerState

        return LearnerState(**data)
    from gspo_rl.learner.sft.train import SFTResult

    ckpt = data.get("checkpoint")
    return SFTResult(**{**data, "checkpoint": Path(ckpt) if ckpt else None})


def _stop_live_runs() -> None:
    for run in list(_LIVE):
        if run.running:
            run.stop()


atexit.register(_stop_live_runs)


def _payload(config: BaseModel) -> dict[str, Any]:
    """The config as JSON, secrets included (it travels on a pipe, not the command line)."""
    data = config.model_dump(mode="json")
    secret = getattr(config, "admin_key", None)
    if secret is not None:
        data["admin_key"] = secret.get_secret_value()
    return data


def start_up(config: Any, log_path: str | Path | None = None) -> Run:
    """``gspo up`` with ``config`` (an ``UpConfig``) in a child process. An earlier run in
    ``config.run_dir`` is set aside first (as ``gspo up`` does), so the records read are this
    run's."""
    from gspo_rl.launch.run_dir import set_aside_previous_run
    from gspo_rl.launch.up import UpConfig
    from gspo_rl.learner.tracking.base import check_installed

    cfg = UpConfig.model_validate(config)
    check_installed(cfg.report_to)
    set_aside_previous_run(cfg.run_dir)
    return Run("up", cfg, _payload(cfg), cfg.run_dir / "metrics.jsonl",
               Path(log_path) if log_path else None)


def start_learner(config: Any, log_path: str | Path | None = None) -> Run:
    """``gspo learn`` with ``config`` (a ``LearnerConfig``) in a child process. The admin key,
    when the config has none, is read from env GSPO_ADMIN_KEY, as ``gspo learn`` does.
    Without ``save_dir`` or ``metrics_jsonl`` the records go to a temporary file."""
    from gspo_rl.learner.config import LearnerConfig
    from gspo_rl.learner.tracking.base import check_installed

    cfg = LearnerConfig.model_validate(config)
    check_installed(cfg.report_to)
    if cfg.admin_key is None and os.environ.get("GSPO_ADMIN_KEY"):
        cfg = cfg.model_copy(update={"admin_key": os.environ["GSPO_ADMIN_KEY"]})
    if cfg.metrics_path is None:
        tmp = Path(tempfile.mkdtemp(prefix="gspo-learn-metrics-")) / "metrics.jsonl"
        cfg = cfg.model_copy(update={"metrics_jsonl": str(tmp)})
    cfg = LearnerConfig.model_validate(cfg.model_dump())  # model_copy does not validate
    assert cfg.metrics_path is not None
    return Run("learn", cfg, _payload(cfg), cfg.metrics_path,
               Path(log_path) if log_path else None)


def start_sft(config: Any, log_path: str | Path | None = None) -> Run:
    """``gspo sft`` with ``config`` (an ``SFTConfig``) in a child process."""
    from gspo_rl.learner.sft.config import SFTConfig
    from gspo_rl.learner.tracking.base import check_installed

    cfg = SFTConfig.model_validate(config)
    check_installed(cfg.report_to)
    return Run("sft", cfg, _payload(cfg), cfg.metrics_path,
               Path(log_path) if log_path else None)
