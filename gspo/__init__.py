"""gspo-rl: the ``gspo`` command line and the Python API.

``import gspo_rl`` is light (no torch, no model code): the names below load on first use.

- Runs in a child process, watched and stopped from Python (``gspo_rl.api``): ``start_up``,
  ``start_learner``, ``start_sft``, returning a ``Run``.
- The same in this process, blocking: ``run_up``, ``run_learner``, ``run_sft``.
- The config models the CLI is built from: ``UpConfig``, ``LearnerConfig`` (with
  ``LossConfig``), ``SFTConfig``, ``ServerSettings``.

Guide: docs/python-api.md.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "start_up": "gspo_rl.api", "start_learner": "gspo_rl.api", "start_sft": "gspo_rl.api",
    "Run": "gspo_rl.api", "RunFailed": "gspo_rl.api",
    "UpConfig": "gspo_rl.launch.up", "UpResult": "gspo_rl.launch.up",
    "run_up": "gspo_rl.launch.up",
    "LearnerConfig": "gspo_rl.learner.config", "LossConfig": "gspo_rl.learner.algorithm.config",
    "run_learner": "gspo_rl.learner.run", "LearnerState": "gspo_rl.learner.checkpoint.store",
    "SFTConfig": "gspo_rl.learner.sft.config", "run_sft": "gspo_rl.learner.sft.train",
    "SFTResult": "gspo_rl.learner.sft.train",
    "ServerSettings": "gspo_rl.server.config",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gspo_rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
