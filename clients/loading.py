"""Find the environment ``gspo env`` runs: a built-in example by name, or your own class.

``gspo env alphabet`` | ``gspo env calculator`` | ``gspo env path/to/my_env.py:MyEnv`` |
``gspo env my_package.my_env:MyEnv``. The class is instantiated without arguments (an
instance, or a function returning one, named the same way works too); ``group_size``, when
given, is set on it afterwards.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from gspo_rl.client.environment import Environment, MultiTurnEnvironment, SingleTurnEnvironment

BUILTIN = {"alphabet": ("gspo_rl.client.examples.alphabet", "AlphabetEnvironment"),
           "calculator": ("gspo_rl.client.examples.calculator", "CalculatorEnvironment")}


def _module(where: str) -> Any:
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"no such file: {path}")
        name = f"gspo_env_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(where)


def load_environment(spec: str, group_size: int | None = None) -> Environment:
    """The environment named by ``spec`` (see the module docstring). ValueError if it is not
    one: unknown name, missing file or attribute, or not an environment."""
    if spec in BUILTIN:
        module_name, attr = BUILTIN[spec]
    elif ":" in spec:
        module_name, _, attr = spec.rpartition(":")
    else:
        raise ValueError(f"unknown environment {spec!r}: alphabet | calculator | "
                         "path/to/module.py:EnvClass | package.module:EnvClass")
    try:
        obj = getattr(_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {spec!r}: {exc}") from exc
    is_env = isinstance(obj, SingleTurnEnvironment | MultiTurnEnvironment)
    env = obj if is_env or not callable(obj) else obj()
    if not isinstance(env, SingleTurnEnvironment | MultiTurnEnvironment):
        raise ValueError(f"{spec!r} is not a SingleTurnEnvironment or MultiTurnEnvironment "
                         f"(got {type(env).__name__})")
    if group_size is not None:
        env.group_size = group_size
    return env
