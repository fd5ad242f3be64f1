"""What runs in a scoring worker process: ``worker_main``, the target the pool spawns.

The worker preloads its modules (``Preload``: by name, or from a file under the name this
process gave it), builds the scorer from the pickled zero-argument factory it is sent first,
then answers each call's arguments with ``("ok", result)`` or ``("error", type, message,
traceback)``; a failed start answers ``("init_error", ...)``, a good one ``("ready", pid)``.
Spawned processes import this module again by its path: it must stay importable as
``gspo_rl.client.scoring.worker`` and import nothing but the standard library.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

Preload = tuple[str, str | None]  # (module name, file to load it from; None: import by name)


def _describe(exc: BaseException) -> tuple[str, str, str]:
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}")
    return name, str(exc), "".join(traceback.format_exception(exc))


def _import(name: str, path: str | None) -> None:
    if path is None:
        importlib.import_module(name)
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path} as {name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickle finds classes through sys.modules
    spec.loader.exec_module(module)


def worker_main(conn: Connection, preload: Sequence[Preload]) -> None:
    """A worker: preload, build the scorer from the pickled factory sent first, then answer
    each call with ("ok", result) or ("error", type, message, traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        for name, path in preload:
            _import(name, path)
        scorer = pickle.loads(conn.recv_bytes())()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("init_error", *_describe(exc)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            args = conn.recv()
        except EOFError:
            return  # the parent is gone
        except Exception as exc:  # noqa: BLE001 - arguments that do not unpickle here
            conn.send(("error", *_describe(exc)))
            continue
        reply: tuple[Any, ...]
        try:
            reply = ("ok", scorer(*args))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
            reply = ("error", *_describe(exc))
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - a result that does not pickle
            conn.send(("error", *_describe(exc)))
