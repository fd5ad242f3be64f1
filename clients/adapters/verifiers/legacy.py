"""Environments written for verifiers' 0.1.x API, refused at load with what is supported.

A 0.1.x environment is a module with a ``load_environment(**kwargs)`` function returning a
``vf.SingleTurnEnv``, ``vf.MultiTurnEnv`` or ``vf.ToolEnv`` (classes of the package's top
level). The installed verifiers 0.4 has none of them: its API is ``verifiers.v1``, a module
that exports its ``Taskset`` subclass (and optionally its own ``Env`` and ``Harness``) through
``__all__``, which verifiers loads into a ``verifiers.v1`` ``Env``. Left to verifiers'
loader, such a module fails deep inside it (``defines no __all__``; ``taskset ... not found``
for a module that merely imports ``verifiers.types``; a bare ``ImportError`` or
``AttributeError``). ``check_module`` imports the module as verifiers would, before anything
is built, and raises a ``ValueError`` that names what the module lacks and what runs when it
(a) imports a name or module of ``verifiers`` that the installed package does not have, or
(b) exports no ``verifiers.v1`` subclass of the expected base (a ``Taskset``; an ``Env`` for
an ``id``), naming ``load_environment`` when it defines one; or (c) is found but imports a
package that is missing (named). Any other import error propagates (the adapter reports it).
"""

from __future__ import annotations

import re
from typing import Any

LEGACY = ("verifiers 0.1.x's API (load_environment() returning a vf.SingleTurnEnv, "
          "vf.MultiTurnEnv, vf.ToolEnv, ...), which gspo does not run")
SUPPORTED = ("gspo runs verifiers 0.4's verifiers.v1 API: a module or package that exports "
             "its vf.Taskset subclass (and optionally its own vf.Env and vf.Harness) through "
             "__all__, with `import verifiers.v1 as vf`; port the environment to it "
             "(docs/environments/verifiers.md)")


def missing_name(exc: BaseException | None) -> str | None:
    """The ``verifiers`` module or attribute whose absence caused ``exc`` (followed through
    ``raise ... from``), or None when it is not one of verifiers'."""
    while exc is not None:
        if isinstance(exc, ModuleNotFoundError):
            if (exc.name or "").split(".")[0] == "verifiers":
                return exc.name
        elif isinstance(exc, ImportError) and (exc.name or "").split(".")[0] == "verifiers":
            found = re.search(r"cannot import name '([^']+)'", str(exc))
            return f"{exc.name}.{found.group(1)}" if found else exc.name
        elif isinstance(exc, AttributeError):
            owner = getattr(getattr(exc, "obj", None), "__name__", None)
            if isinstance(owner, str) and owner.split(".")[0] == "verifiers":
                return f"{owner}.{exc.name}"
        exc = exc.__cause__
    return None


def _import(kind: str, module_id: str) -> Any:
    from verifiers.v1.utils.loaders import import_environment, import_taskset

    importer = import_taskset if kind == "taskset" else import_environment
    try:
        return importer(module_id)
    except (ImportError, AttributeError) as exc:
        name = missing_name(exc)
        if name is None:
            _raise_for_dependency(kind, module_id, exc)
            raise
        era = "" if name.startswith("verifiers.v1") else f": it is written for {LEGACY}"
        raise ValueError(f"{kind} {module_id!r} uses {name}, which the installed verifiers "
                         f"does not have{era}; {SUPPORTED}") from None


def _raise_for_dependency(kind: str, module_id: str, exc: BaseException) -> None:
    """A module that was found but imports a missing package: say so (verifiers' loader
    reports it as the module itself not found)."""
    cause = exc.__cause__
    wanted = module_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    if isinstance(cause, ModuleNotFoundError) and cause.name and not (
            wanted == cause.name or wanted.startswith(cause.name + ".")):
        raise ValueError(f"{kind} {module_id!r} cannot be imported: {cause}") from None


def check_module(spec: str, kind: str, module_id: str) -> None:
    """Refuse the ``kind`` ("taskset", or "environment" for an ``id``) module ``module_id``
    of ``spec`` (named first in the message) unless it speaks ``verifiers.v1`` (module
    docstring)."""
    try:
        _check(kind, module_id)
    except ValueError as exc:
        raise ValueError(f"{spec}: {exc}") from None


def _check(kind: str, module_id: str) -> None:
    from verifiers.v1.env import Env
    from verifiers.v1.taskset import Taskset

    base: type = Taskset if kind == "taskset" else Env
    module = _import(kind, module_id)
    names = getattr(module, "__all__", None)
    exported = [getattr(module, n, None) for n in names or ()]
    if any(isinstance(o, type) and issubclass(o, base) and o is not base for o in exported):
        return
    entry = getattr(module, "load_environment", None)
    if callable(entry) and not str(getattr(entry, "__module__", "")).startswith("verifiers"):
        raise ValueError(f"{kind} module {module.__name__!r} defines load_environment() and "
                         f"exports no verifiers.v1 {base.__name__} subclass: it is written for "
                         f"{LEGACY}; {SUPPORTED}")
    found = "no __all__" if names is None else f"__all__ = {list(names)!r}"
    raise ValueError(f"{kind} module {module.__name__!r} exports no verifiers.v1 "
                     f"{base.__name__} subclass ({found}); {SUPPORTED}")
