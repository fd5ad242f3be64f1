"""``gspo_rl.redisq.ready.entry``: the learner's decode of a by-reference entry
(``unpack_entry``) gives exactly what ``unpack_ready_group`` gives for the joined bytes, with the
records one key per rollout or one key for the group (a subset picked by id, as a partial group
publishes), and refuses what the joined bytes refuse."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest

from gspo_rl.contract.credit import AdvantageConfig
from gspo_rl.contract.schema import (
    READY_COUNT_FIELD,
    READY_HEAD_FIELD,
    READY_RECORDS_FIELD,
    Keys,
    ReadyGroup,
    RolloutRecord,
    join_ready_group,
    member_of,
    member_rollout_id,
    pack_rollout,
    unpack_ready_group,
)
from gspo_rl.redisq.groups.finish import ready_group_head
from gspo_rl.redisq.ready.entry import (
    EntryRefs,
    entry_record_bytes,
    pack_group_records,
    ready_entry_refs,
    split_group_records,
    unpack_entry,
    unpack_group_records,
)
from tests.helpers.queue import make_rollout

_BAD = (ValueError, TypeError, KeyError)  # what msgpack and the record decoding raise


def _recs(n: int) -> list[RolloutRecord]:
    recs = [make_rollout(f"r{i}", "g", 40 + i, version=i, seed=i) for i in range(n)]
    recs[0].metadata = {"k": [1, "é"]}
    return recs


def _head(n: int) -> bytes:
    return ready_group_head("g", {"task": "t"}, 12.5, [float(i) for i in range(n)],
                            [0.25 * i - 1 for i in range(n)], [None] * (n - 1) + [[0.5]],
                            [[0.1 * i] for i in range(n)], AdvantageConfig(eps=1e-3))


def _refs(ids: list[str], grouped: bool) -> EntryRefs:
    fields = {READY_HEAD_FIELD.encode(): _head(len(ids)),
              READY_COUNT_FIELD.encode(): msgpack.packb(ids)}
    if grouped:
        fields[READY_RECORDS_FIELD.encode()] = b"g"
    ref = ready_entry_refs(Keys(), fields)
    assert ref is not None
    return ref


def _as_plain(g: ReadyGroup | None) -> dict:
    assert g is not None
    d = dataclasses.asdict(g)
    for r in d["rollouts"]:
        for k, v in r.items():
            if isinstance(v, np.ndarray):
                r[k] = (v.dtype.str, v.tolist())
    return d


def test_refs_name_one_key_per_rollout_or_the_groups_one_key() -> None:
    assert _refs(["a", "b"], False).keys == [Keys().rollout("a"), Keys().rollout("b")]
    grouped = _refs(["a", "b"], True)
    assert grouped.keys == [Keys().group_records("g")] and grouped.rollout_ids == ["a", "b"]
    assert ready_entry_refs(Keys(), {b"group": b"x"}) is None  # an inline entry


@pytest.mark.parametrize("n", [1, 3, 8, 17])
def test_both_layouts_decode_as_the_joined_bytes(n: int) -> None:
    recs = _recs(n)
    ids = [r.rollout_id for r in recs]
    records = [pack_rollout(r) for r in recs]
    joined = unpack_ready_group(join_ready_group(_head(n), records))
    blob = pack_group_records(recs)
    assert split_group_records(blob) == records
    assert [r.rollout_id for r in unpack_group_records(blob)] == ids
    for ref, values in ((_refs(ids, False), records), (_refs(ids, True), [blob])):
        assert entry_record_bytes(ref, values) == records
        got = unpack_entry(ref, values)
        assert _as_plain(got) == _as_plain(joined)
        assert got is not None and got.min_version() == joined.min_version() == 0


def test_a_subset_is_picked_from_the_groups_records_by_id() -> None:
    recs = _recs(5)
    blob = pack_group_records(recs)
    ref = _refs(["r1", "r4"], True)
    records = [pack_rollout(recs[1]), pack_rollout(recs[4])]
    assert entry_record_bytes(ref, [blob]) == records
    want = unpack_ready_group(join_ready_group(ref.head, records))
    assert _as_plain(unpack_entry(ref, [blob])) == _as_plain(want)
    with pytest.raises(KeyError):  # an id the group's records do not have
        unpack_entry(_refs(["r1", "zz"], True), [blob])


def test_a_missing_key_is_none() -> None:
    assert unpack_entry(_refs(["r0", "r1"], False), [pack_rollout(_recs(1)[0]), None]) is None
    assert unpack_entry(_refs(["r0"], True), [None]) is None
    assert entry_record_bytes(_refs(["r0"], True), [None]) is None


def test_what_the_joined_bytes_refuse_is_refused() -> None:
    recs = _recs(3)
    records = [pack_rollout(r) for r in recs]
    ids = [r.rollout_id for r in recs]
    head = _head(3)
    for bad in (records[:2], [*records, records[0]]):  # the head counts 3 rollouts
        with pytest.raises(_BAD):
            unpack_ready_group(join_ready_group(head, bad))
        refs = EntryRefs(head, [f"r{i}" for i in range(len(bad))], ["k"] * len(bad), False)
        with pytest.raises(_BAD):
            unpack_entry(refs, bad)
    flat = _refs(ids, False)
    with pytest.raises(_BAD):
        unpack_entry(flat, [records[0], b"\x93\x01", records[2]])  # not a record
    with pytest.raises(_BAD):
        unpack_entry(flat, [records[0], records[1][:-3], records[2]])  # truncated
    blob = pack_group_records(recs)
    grouped = _refs(ids, True)
    for bad_blob in (blob[:-3], blob + b"\x01", msgpack.packb([1, 2, 3]), b"\x01"):
        with pytest.raises(_BAD):
            unpack_entry(grouped, [bad_blob])
    with pytest.raises(_BAD):
        split_group_records(blob + b"\x01")


def test_member_ids_name_their_group_and_nothing_else_does() -> None:
    for gid in ("g", "0f" * 16, "a:b", "é"):
        for i in (0, 7, 123):
            assert member_of(member_rollout_id(gid, i)) == (gid, i)
    for rid in ("g", "g:", ":3", "g:01", "g:-1", "g:1.0", "g:٣", "g:3 ", "0f0f"):
        assert member_of(rid) is None, rid
