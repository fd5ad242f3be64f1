"""``verifiers:MODULE[:JSON]``: a verifiers 0.4 environment (its ``verifiers.v1`` API), run
unmodified with gspo's server as the model (``environment.VerifiersEnvironment``).

``MODULE`` is a verifiers taskset id: an installed package exporting a ``Taskset`` subclass
(and optionally its own ``Env`` and ``Harness``) through ``__all__``, as verifiers loads it
(a 0.1.x ``load_environment()`` module is refused at load, ``legacy``); or the path of such a
package folder or module file (its folder is put on ``sys.path`` and on ``PYTHONPATH``, for
verifiers' ``python -m`` tool servers). ``JSON`` (optional): its taskset configuration.
``args`` (``--env-arg``) take:

- ``group_size`` (default 8), ``seed`` (task order), ``sampling`` (``temperature`` 1.0,
  ``max_tokens``, ...: the model calls' settings);
- ``eval``: ``{"limit": N}`` holds the first N tasks out of training as the eval set, or
  ``{"taskset": {...}, "limit": N}`` takes the eval set from the taskset configured so (a
  test split); evaluated every ``every`` (10) versions with ``samples`` (4) episodes each;
- ``harness``: the harness every agent seat plays unless it names its own (``null``: a plain
  chat loop; verifiers' default for a taskset without its own is ``bash``, a shell tool);
- ``runtime_python``: ``prefork`` (default: harness programs run with this interpreter, whose
  ``verifiers`` extra holds their dependencies, forked from a server that imported them once),
  ``this`` (the same, a fresh interpreter per program) or ``uv`` (verifiers' own: ``uv``
  installs them at run time);
- anything else is verifiers' ``EnvConfig``: ``taskset.*``, each agent seat's settings
  (``agent.harness.id=null``, ``agent.runtime.type=docker``, ``agent.timeout.*``), ``id``
  (another ``Env`` for the taskset), ``timeout.*``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from gspo_rl.client.adapters import missing

OWN_KEYS = ("group_size", "seed", "sampling", "eval", "runtime_python", "harness")


def taskset_id(where: str) -> str:
    """The taskset id of ``where``: a module name as is; a path's stem, its folder put on
    ``sys.path`` first (ValueError if it does not exist)."""
    if "/" not in where and "\\" not in where and not where.endswith(".py"):
        return where
    path = Path(where).expanduser().resolve()
    if not path.exists():
        raise ValueError(f"verifiers: no such taskset module or package: {path}")
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    # verifiers runs a taskset's tool servers as `python -m <module>` subprocesses
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if folder not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [folder, *paths] if p)
    return path.stem


def split_target(target: str) -> tuple[str, dict[str, Any]]:
    """``MODULE[:JSON]`` -> (module, taskset settings)."""
    where, sep, raw = target.partition(":{")
    if not sep:
        return target, {}
    try:
        settings = json.loads("{" + raw)
    except ValueError as exc:
        raise ValueError(f"verifiers:{target}: the taskset settings after ':' are not "
                         f"JSON ({exc})") from None
    if not isinstance(settings, dict):
        raise ValueError(f"verifiers:{target}: the taskset settings must be a JSON object")
    return where, settings


def load(target: str, args: dict[str, Any]) -> Any:
    """The ``VerifiersEnvironment`` of ``verifiers:TARGET`` with ``args`` (module docstring);
    ValueError for what it cannot run, ``AdapterUnavailable`` without verifiers."""
    try:
        from gspo_rl.client.adapters.verifiers.environment import VerifiersEnvironment
        from gspo_rl.client.adapters.verifiers.hooks import check_version
        from gspo_rl.client.adapters.verifiers.legacy import check_module

        check_version()
    except ImportError as exc:
        raise missing("verifiers", exc) from None
    where, taskset = split_target(target)
    config = {k: v for k, v in args.items() if k not in OWN_KEYS}
    config["taskset"] = {**taskset, **config.get("taskset", {})}
    ev = dict(args.get("eval") or {})
    try:
        tid = taskset_id(where)
        check_module(f"verifiers:{target}", "taskset", tid)  # 0.1.x: refused, saying why
        if config.get("id"):
            check_module(f"verifiers:{target}", "environment", str(config["id"]))
        return VerifiersEnvironment(
            tid, config, group_size=int(args.get("group_size", 8)),
            sampling=args.get("sampling"), seed=int(args.get("seed", 0)),
            hold_out=0 if "taskset" in ev else int(ev.get("limit", 0)),
            eval_taskset=ev.get("taskset"), eval_limit=int(ev.get("limit", 50)),
            eval_every=ev.get("every"), eval_samples=ev.get("samples"),
            runtime_python=str(args.get("runtime_python", "prefork")),
            harness=args.get("harness"))
    except (ImportError, AttributeError, TypeError) as exc:
        raise ValueError(f"verifiers:{target}: {exc}") from None
    except Exception as exc:
        if type(exc).__name__ == "ValidationError":
            raise ValueError(f"verifiers:{target}: invalid settings: {exc}") from None
        raise
