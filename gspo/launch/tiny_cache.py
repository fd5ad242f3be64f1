"""The tiny model ``gspo up`` starts from without ``--model``: built once per machine, copied
into each run.

``tiny_model(path, seed)`` leaves at ``path`` what ``make_tiny_model(path, seed=seed)`` writes.
The builder's files are byte-identical for equal arguments, so the first build is kept in a
cache (``$GSPO_CACHE_DIR``, else ``$XDG_CACHE_HOME/gspo-rl``, else ``~/.cache/gspo-rl``, under
``tiny-models/<key>``) and later runs copy it: building imports torch and transformers (about
5 s of CPU in ``gspo up``'s own process), copying imports neither. The key hashes the builder's
source, its arguments and the versions of torch, transformers, tokenizers and safetensors, so
a change to any of them builds anew. A cache that cannot be written or read is passed by
(the model is built in place); concurrent first builds each write a private directory and
the first to finish is kept.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
from pathlib import Path

COMPLETE = ".gspo-complete"
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors")


def cache_root() -> Path:
    base = os.environ.get("GSPO_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gspo-rl")
    return Path(base) / "tiny-models"


def cache_key(seed: int) -> str:
    """What the built files depend on: the builder's source, its arguments, the libraries."""
    spec = importlib.util.find_spec("gspo_rl.tiny_model")
    source = Path(spec.origin).read_bytes() if spec and spec.origin else b""
    versions = []
    for lib in LIBRARIES:
        try:
            versions.append(f"{lib}={importlib.metadata.version(lib)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{lib}=none")
    h = hashlib.sha256(source)
    h.update(f"seed={seed};{';'.join(versions)}".encode())
    return h.hexdigest()[:24]


def _build(path: Path, seed: int) -> Path:
    from gspo_rl.tiny_model import make_tiny_model

    return Path(make_tiny_model(path, seed=seed))


def _cached(seed: int) -> Path:
    """The cache's copy for ``seed``, built first if it has none (OSError: no cache here)."""
    final = cache_root() / cache_key(seed)
    if (final / COMPLETE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    private = final.parent / f".{final.name}.{os.getpid()}"
    shutil.rmtree(private, ignore_errors=True)
    _build(private, seed)
    (private / COMPLETE).touch()
    try:
        private.rename(final)
    except OSError:  # another run finished first (or a stale, incomplete one is in the way)
        shutil.rmtree(private, ignore_errors=True)
        if not (final / COMPLETE).is_file():
            raise
    return final


def tiny_model(path: Path, seed: int = 0) -> Path:
    """The tiny model for ``seed`` at ``path`` (module docstring)."""
    try:
        cached = _cached(seed)
        shutil.copytree(cached, path, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(COMPLETE))
        return path
    except OSError:
        return _build(path, seed)
