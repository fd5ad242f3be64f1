"""The child process of the Python API (``gspo_rl.api``): reads one JSON request on stdin,
``{"kind": "up" | "learn" | "sft", "config": {...}, "result": path}``, validates the config
with its model (``UpConfig``, ``LearnerConfig``, ``SFTConfig``), runs it in this process as
the CLI would (``run_up``, ``run_learner``, ``run_sft``: their signal handling included), and
writes what it returned to ``result`` as JSON (``{"interrupted": true}`` when a signal ended
it first). Secrets travel in the request, never on the command line (``ps`` shows that).

    python -m gspo_rl.launch.child < request.json
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from gspo_rl.logs import configure_logging, log_config

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def _run(kind: str, config: dict[str, Any]) -> Any:
    """Validate ``config`` with its model (torch-free), then import and call the runner."""
    if kind == "up":
        from gspo_rl.launch.up import UpConfig, run_up

        up_cfg = UpConfig.model_validate(config)
        log_config("up", up_cfg)
        return run_up(up_cfg)
    if kind == "learn":
        from gspo_rl.learner.config import LearnerConfig

        learner_cfg = LearnerConfig.model_validate(config)
        log_config("learn", learner_cfg)
        from gspo_rl.learner.run import run_learner

        return run_learner(learner_cfg)
    if kind == "sft":
        from gspo_rl.learner.sft.config import SFTConfig

        sft_cfg = SFTConfig.model_validate(config)
        log_config("sft", sft_cfg)
        from gspo_rl.learner.sft.train import run_sft

        return run_sft(sft_cfg)
    raise ValueError(f"unknown run kind {kind!r}")


def main() -> int:
    request = json.loads(sys.stdin.read())
    configure_logging("INFO")
    result_path = Path(request["result"])
    try:
        out = _run(request["kind"], request["config"])
    except KeyboardInterrupt:  # a second signal, or run_up's way of stopping on one
        result_path.write_text(json.dumps({"interrupted": True}))
        return 130
    # (an instance: the runners return no class)
    body = (dataclasses.asdict(cast("DataclassInstance", out)) if dataclasses.is_dataclass(out)
            else None)
    interrupted = bool(getattr(out, "interrupted", False))  # run_up stopped by the signal
    result_path.write_text(json.dumps({"interrupted": interrupted, "result": body},
                                      default=str))
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
