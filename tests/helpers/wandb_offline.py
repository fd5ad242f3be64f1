"""Reading what W&B wrote in offline mode: the records of a run's ``run-<id>.wandb`` file.

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then
LevelDB-log framing (32 KiB blocks; each chunk a 7-byte header of crc32, little-endian length
and type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4; a block's tail shorter than a header is
padding) around protobuf ``Record`` messages (``wandb.proto.wandb_internal_pb2``), the same
records ``wandb sync`` uploads.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

_BLOCK, _HEADER = 32768, 7


def _chunks(data: bytes) -> list[bytes]:
    records, partial, pos = [], b"", _HEADER
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + _HEADER:pos + _HEADER + n]
        pos += _HEADER + n
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            partial = chunk
        elif kind == 3:
            partial += chunk
        else:
            records.append(partial + chunk)
    return records


def read_run(run_dir: Path) -> dict[str, Any]:
    """``{"run": Record.run, "config": {...}, "history": [{key: value}, ...]}`` of the
    offline run directory ``run_dir`` (``wandb/offline-run-*``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    out: dict[str, Any] = {"run": None, "config": {}, "history": []}
    for raw in _chunks(data):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run"] = rec.run
            out["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                   for i in rec.history.item})
    return out
