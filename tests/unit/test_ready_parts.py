"""``unpack_ready_parts`` (the learner's decode of a by-reference entry) gives exactly what
``unpack_ready_group`` gives for the joined bytes, and refuses what the joined bytes refuse."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest

from contract.credit import AdvantageConfig
from contract.redis_schema import (
    ReadyGroup,
    join_ready_group,
    pack_rollout,
    unpack_ready_group,
    unpack_ready_parts,
)
from server.store_finish import ready_group_head
from tests.queue_helpers import make_rollout

_BAD = (ValueError, TypeError, KeyError)  # what msgpack and the record decoding raise


def _parts(n: int) -> tuple[bytes, list[bytes]]:
    recs = [make_rollout(f"r{i}", "g", 40 + i, version=i, seed=i) for i in range(n)]
    recs[0].metadata = {"k": [1, "é"]}
    head = ready_group_head("g", {"task": "t"}, 12.5, [float(i) for i in range(n)],
                            [0.25 * i - 1 for i in range(n)], [None] * (n - 1) + [[0.5]],
                            [[0.1 * i] for i in range(n)], AdvantageConfig(eps=1e-3))
    return head, [pack_rollout(r) for r in recs]


def _as_plain(g: ReadyGroup) -> dict:
    d = dataclasses.asdict(g)
    for r in d["rollouts"]:
        for k, v in r.items():
            if isinstance(v, np.ndarray):
                r[k] = (v.dtype.str, v.tolist())
    return d


@pytest.mark.parametrize("n", [1, 3, 8, 17])
def test_parts_decode_as_the_joined_bytes(n: int) -> None:
    head, records = _parts(n)
    joined = unpack_ready_group(join_ready_group(head, records))
    split = unpack_ready_parts(head, records)
    assert _as_plain(split) == _as_plain(joined)
    assert split.min_version() == joined.min_version() == 0


def test_parts_refuse_what_the_joined_bytes_refuse() -> None:
    head, records = _parts(3)
    for bad in (records[:2], [*records, records[0]]):  # the head counts 3 rollouts
        with pytest.raises(_BAD):
            unpack_ready_group(join_ready_group(head, bad))
        with pytest.raises(_BAD):
            unpack_ready_parts(head, bad)
    with pytest.raises(_BAD):
        unpack_ready_parts(head, [records[0], b"\x93\x01", records[2]])  # not a record
    with pytest.raises(_BAD):
        unpack_ready_parts(head, [records[0], records[1][:-3], records[2]])  # truncated
    assert msgpack.unpackb(records[1])["rollout_id"] == "r1"
