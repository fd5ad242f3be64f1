"""A ready-stream entry published by reference, and the records it names
(``gspo_rl.contract.schema`` documents the keys).

An entry holds the group's ``head`` (``pack_ready_group``'s bytes up to the rollouts' array
header) and the published rollout ids; their records are either one key per rollout
(``{p}:rollout:{id}``, a multi-turn episode's) or, for a group the sampling path recorded
whole, one key for the group (``{p}:group:{gid}:records``, a msgpack array of every record of
the group in its list order, named by the entry's ``records`` field). Either way
``head + the published records' bytes`` is exactly ``pack_ready_group``'s bytes.

A partially published group (finalised at its deadline with the rewarded rollouts it had)
publishes a subset of its records: the published ids pick them from the group's array.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgpack

from gspo_rl.contract.schema import (
    READY_COUNT_FIELD,
    READY_HEAD_FIELD,
    READY_RECORDS_FIELD,
    Keys,
    ReadyGroup,
    RolloutRecord,
    ready_group_from_dict,
    rollout_fields,
    rollout_from_dict,
)

_NIL = b"\xc0"


@dataclass(frozen=True)
class EntryRefs:
    """What a by-reference entry names: its head, the published rollout ids (in order), and
    the keys that hold their records (``grouped``: one key, the group's array; else one key
    per id)."""

    head: bytes
    rollout_ids: list[str]
    keys: list[str]
    grouped: bool


def ready_entry_refs(keys: Keys, fields: dict[bytes, bytes]) -> EntryRefs | None:
    """A stream entry's references; None for an entry that is not by reference (inline, or
    malformed)."""
    head, ids = fields.get(READY_HEAD_FIELD.encode()), fields.get(READY_COUNT_FIELD.encode())
    if head is None or ids is None:
        return None
    rids = [r.decode() if isinstance(r, bytes) else str(r) for r in msgpack.unpackb(ids)]
    group = fields.get(READY_RECORDS_FIELD.encode())
    if group is not None:
        return EntryRefs(head, rids, [keys.group_records(group.decode())], True)
    return EntryRefs(head, rids, [keys.rollout(r) for r in rids], False)


def pack_group_records(records: Sequence[RolloutRecord]) -> bytes:
    """A group's records as one msgpack array (each element ``pack_rollout``'s bytes)."""
    return cast(bytes, msgpack.packb([rollout_fields(r) for r in records]))  # (untyped msgpack)


def split_group_records(blob: bytes) -> list[bytes]:
    """``pack_group_records``'s bytes -> each record's bytes (not decoded)."""
    up = msgpack.Unpacker(max_buffer_size=max(len(blob), 1))
    up.feed(blob)
    out, start = [], None
    for _ in range(up.read_array_header()):
        start = up.tell()
        up.skip()
        out.append(blob[start:up.tell()])
    if up.tell() != len(blob):
        raise ValueError("trailing bytes after a group's records")
    return out


def _pick(ids: list[str], found: Sequence[str], items: Sequence[Any]) -> list[Any]:
    """``items`` (one per id in ``found``, the group's order) for the published ``ids``."""
    if list(found) == ids:
        return list(items)
    by_id = dict(zip(found, items, strict=True))
    missing = [r for r in ids if r not in by_id]
    if missing:
        raise KeyError(f"rollouts {missing} are not among the group's records")
    return [by_id[r] for r in ids]


def entry_record_bytes(ref: EntryRefs, values: Sequence[bytes | None]) -> list[bytes] | None:
    """The published records' bytes, in order, from the values of ``ref.keys`` (None when
    one has expired): ``join_ready_group(ref.head, them)`` is the group's packed bytes."""
    if any(v is None for v in values):
        return None
    if not ref.grouped:
        return cast("list[bytes]", list(values))  # no None: checked above
    raw = split_group_records(cast(bytes, values[0]))
    if len(raw) == len(ref.rollout_ids):
        return raw  # every record published (the common case): the same ids, same order
    ids = [msgpack.unpackb(r)["rollout_id"] for r in raw]
    return _pick(ref.rollout_ids, ids, raw)


def unpack_entry(ref: EntryRefs, values: Sequence[bytes | None]) -> ReadyGroup | None:
    """The entry's group, decoded (what the learner trains on); None when a record has
    expired. Raises on bytes that are not what was published (the caller counts the entry as
    unreadable)."""
    if any(v is None for v in values):
        return None
    if ref.grouped:
        dicts = _pick(ref.rollout_ids, *_ids_and_dicts(cast(bytes, values[0])))  # not None
    else:
        dicts = [msgpack.unpackb(v) for v in values]
    d = msgpack.unpackb(ref.head + _NIL * len(dicts))
    return ready_group_from_dict(d, [rollout_from_dict(x) for x in dicts])


def _ids_and_dicts(blob: bytes) -> tuple[list[str], list[dict[str, Any]]]:
    dicts = msgpack.unpackb(blob)
    if not isinstance(dicts, list):
        raise ValueError("a group's records are not an array")
    return [x["rollout_id"] for x in dicts], dicts


def unpack_group_records(blob: bytes) -> list[RolloutRecord]:
    """Every record of ``pack_group_records``'s bytes, decoded."""
    return [rollout_from_dict(d) for d in _ids_and_dicts(blob)[1]]
