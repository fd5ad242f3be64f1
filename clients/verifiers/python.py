"""The ``python`` verifier: your own function, named ``path/to/file.py:fn`` or ``pkg.mod:fn``.

It is called as ``fn(completion, answer, task)`` (``task``: the record's fields) and returns
a ``Verdict``, a bool (correct or not: reward 1 or 0) or a number (the reward; correct when it
is at least ``threshold``). Anything else, or an exception, is an error (the task's group
fails and is retried or abandoned: never a reward of 0.0).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gspo_rl.client.verifiers.base import Verdict, Verifier


def load_callable(spec: str) -> Callable[..., Any]:
    """``path/to/file.py:name`` or ``package.module:name`` -> the object; ValueError if not."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"name a function as path/to/file.py:fn or package.module:fn, "
                         f"got {spec!r}")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"no such file: {path}")
        module_name = f"gspo_verifier_{path.stem}"
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"cannot import {path}")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        loader_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise ValueError(f"cannot import {where!r}: {exc}") from exc
    fn: object = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{spec!r} is not a function")
    return fn


class PythonVerifier(Verifier):
    kind = "python"

    def __init__(self, *, function: str | Callable[..., Any], threshold: float = 1.0,
                 **options: Any) -> None:
        super().__init__(**options)
        self.fn = load_callable(function) if isinstance(function, str) else function
        self.threshold = threshold

    def __call__(self, completion: str, answer: Any,
                 task: Mapping[str, Any] | None = None) -> Verdict:
        got = self.extracted(completion)
        out = self.fn(got if got is not None else "", answer, dict(task or {}))
        if isinstance(out, Verdict):
            return out
        if isinstance(out, bool):
            return Verdict(reward=float(out), correct=out)
        if isinstance(out, int | float) and math.isfinite(out):
            return Verdict(reward=float(out), correct=out >= self.threshold)
        raise TypeError(f"the verifier {getattr(self.fn, '__name__', self.fn)!r} returned "
                        f"{out!r}: return a bool, a finite number or a Verdict")
