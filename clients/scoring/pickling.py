"""What a scoring worker is sent: the scorer's factory pickled, and the modules it preloads.

``pickled(obj)``: the pickle, and the modules its classes and functions come from;
``PICKLE_ERRORS``: what pickling an object that does not pickle raises. ``preload_entry``: a
``preload`` item as a ``Preload`` (a module name as is, a ``.py`` file under the name this
process loaded it as); ``file_modules``: the modules among those a pickle refers to that were
loaded from files (``FILE_MODULE_PREFIXES``), which a fresh process must load by file.
"""

from __future__ import annotations

import io
import pickle
import sys
from pathlib import Path
from typing import Any

from gspo_rl.client.scoring.worker import Preload

FILE_MODULE_PREFIXES = ("gspo_env_", "gspo_verifier_")
"""Names under which ``gspo_rl.client`` loads modules from files: preloaded by file."""

PICKLE_ERRORS = (pickle.PicklingError, TypeError, AttributeError)
"""What pickling an object that does not pickle raises (a lock, a lambda, a local class)."""


class _Pickler(pickle.Pickler):
    """Pickles, noting the module of every class, function and object it meets."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        try:
            module = getattr(obj, "__module__", None)
        except Exception:  # noqa: BLE001 - a proxy's __getattr__: it names no module
            module = None
        if isinstance(module, str):
            self.modules.add(module)
        return NotImplemented  # pickled the usual way


def pickled(obj: Any) -> tuple[bytes, set[str]]:
    """``obj`` pickled, and the modules its classes and functions come from."""
    buf = io.BytesIO()
    pickler = _Pickler(buf)
    pickler.dump(obj)
    return buf.getvalue(), pickler.modules


def preload_entry(item: str) -> Preload:
    """A module name as is; a file as the name this process loaded it under (else
    ``gspo_env_<stem>``, as ``gspo_rl.client.loading`` names it)."""
    if not (item.endswith(".py") or "/" in item or "\\" in item):
        return item, None
    path = str(Path(item).expanduser().resolve())
    if not Path(path).is_file():
        raise ValueError(f"preload: no such file: {path}")
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == path:
            return name, path
    return f"gspo_env_{Path(path).stem}", path


def file_modules(names: set[str]) -> list[Preload]:
    """The modules among ``names`` that were loaded from files (``FILE_MODULE_PREFIXES``):
    a fresh process cannot import them by name."""
    out = []
    for name in sorted(names):
        path = getattr(sys.modules.get(name), "__file__", None)
        if name.startswith(FILE_MODULE_PREFIXES) and path:
            out.append((name, path))
    return out
