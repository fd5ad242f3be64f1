"""Reading task records: JSONL (no dependency), JSON, Parquet, a Hugging Face ``datasets``
directory.

``read_records(path)`` returns the rows as dicts: ``.jsonl`` / ``.ndjson`` (one JSON object a
line, blank lines skipped), ``.json`` (a list of objects), ``.parquet`` (pyarrow, else pandas:
the ``data`` extra), or a directory written by ``datasets``' ``save_to_disk`` (a ``Dataset``,
or a ``DatasetDict`` with ``split`` naming one of its splits; the ``data`` extra). Nothing is
ever downloaded. A malformed row is an error naming the file and line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

JSONL_SUFFIXES = (".jsonl", ".ndjson")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{n}: not JSON: {exc}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: a record must be a JSON object, got "
                                 f"{type(row).__name__}")
            rows.append(row)
    return rows


def _json(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError(f"{path}: a .json task file must hold a list of objects")
    return data


def _parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("reading Parquet needs pyarrow (or pandas): pip install "
                              "'gspo-rl-client[data]'") from exc
        return cast("list[dict[str, Any]]", pd.read_parquet(path).to_dict("records"))  # (untyped)
    return cast("list[dict[str, Any]]", pq.read_table(path).to_pylist())  # (pyarrow: untyped)


def _dataset_dir(path: Path, split: str | None) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(f"{path} is a directory: reading a Hugging Face datasets directory "
                          "needs datasets: pip install 'gspo-rl-client[data]'") from exc
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        splits = sorted(loaded)
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in loaded:
            raise ValueError(f"{path} holds the splits {splits}: name one (split = ...)")
        loaded = loaded[split]
    elif split is not None:
        raise ValueError(f"{path} is a single dataset: it has no split {split!r}")
    return [dict(row) for row in loaded]


def read_records(path: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """Every record of ``path`` (module docstring); ValueError when it cannot be read."""
    p = Path(path).expanduser()
    if p.is_dir():
        return _dataset_dir(p, split)
    if not p.is_file():
        raise ValueError(f"no such task file: {p}")
    if split is not None:
        raise ValueError(f"{p} is a file: split is for a datasets directory")
    suffix = p.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return _jsonl(p)
    if suffix == ".json":
        return _json(p)
    if suffix in (".parquet", ".pq"):
        return _parquet(p)
    raise ValueError(f"{p}: unknown task file type {suffix!r}: .jsonl, .json, .parquet, or a "
                     "directory saved by datasets")
