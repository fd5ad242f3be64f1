"""The learner's side of the ready-group stream: batches of groups, a staleness bound, and
acknowledgement only after the step that used them is committed.

``GroupReader.read_batch`` delivers groups through the consumer group ``learners``
(redelivered pending entries first: after a crash they belong to steps that died with the
process), drops and acknowledges groups older than ``max_staleness`` versions (counted along
the learner's resumes, ``gspo_rl.redisq.ready.lineage``), and
fetches a batch's records with one MGET. ``ack`` acknowledges (idempotent) and trims the
stream below what every consumer group still needs, with the trimmed entries' records, in one
script (``ACK_AND_TRIM``). With the learner saving the trained ids in its checkpoint before
acknowledging, every group is in exactly one committed step. docs/design/redis-protocol.md
tells the protocol in full."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from redis.typing import StreamIdT

from gspo_rl.contract.schema import (
    LEARNER_CONSUMER_GROUP,
    READY_COUNT_FIELD,
    READY_RECORDS_FIELD,
    READY_STREAM_FIELD,
    Keys,
    ReadyGroup,
    as_str,
    key_template,
    unpack_ready_group,
)
from gspo_rl.redisq.ready.entry import EntryRefs, ready_entry_refs, unpack_entry
from gspo_rl.redisq.ready.lineage import Lineage
from gspo_rl.redisq.ready.scripts import ACK_AND_TRIM, DELIVER

logger = logging.getLogger(__name__)

_CLAIM_PAGE = 100
KEEP_TRAINED_S = 600  # default: how long a trimmed group's rollout records stay readable
# Stream entries as redis-py gives them, (id, fields): bytes, the clients here using
# decode_responses=False (redis-py's types also allow str)
_Entries = list[tuple[bytes | None, dict[bytes, bytes] | None]]
# XPENDING's rows: the ids and consumer names bytes too (redis-py: bytes | str | int)
_Pending = list[dict[str, Any]]


@dataclass
class Batch:
    groups: list[ReadyGroup]
    entry_ids: list[str]  # stream ids, same order as groups
    dropped_stale: int  # dropped (and acked) while assembling this batch
    staleness: list[int]  # updates from group.min_version() to current (Lineage.staleness)
    reclaimed: int = 0  # how many of the groups were redelivered pending entries
    dropped_malformed: list[str] = field(default_factory=list)  # ids acked as unreadable


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class GroupReader:
    """Reads ``ReadyGroup`` records for the learner (synchronous redis-py client)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys = Keys(),
        consumer: str = "learner-0",
        max_staleness: int | None = None,
        group: str = LEARNER_CONSUMER_GROUP,
        claim_all_on_start: bool = True,
        claim_idle_s: float = 300.0,
        keep_trained_s: int = KEEP_TRAINED_S,
    ) -> None:
        self.client = client
        self.keys = keys
        self.consumer = consumer
        self.max_staleness = max_staleness
        self.lineage = Lineage()  # the learner's resumes: staleness counted along them
        self.group = group
        self.claim_idle_s = claim_idle_s
        self._stream = keys.ready_stream
        self._startup_claim = claim_all_on_start
        self._cursor = "-"  # where the startup claim goes on (pending ids, ascending)
        self._ensure_group()
        # The startup claim covers only entries delivered before this reader existed: every
        # entry delivered later (by '>') has a larger id, so it can never come back through
        # the claim pages while this process still holds it untrained or uncheckpointed.
        self._claim_end = self._last_delivered()
        self._held: set[str] = set()  # see ``rearm``
        self._committed: set[str] = set()
        self._ack_trim = client.register_script(ACK_AND_TRIM.source)
        self._deliver_script = client.register_script(DELIVER.source)
        self.keep_trained_s = keep_trained_s
        self._r_tpl = key_template(keys.rollout)
        self._b_tpl = key_template(keys.group_records)

    def _last_delivered(self) -> str:
        for g in self.client.xinfo_groups(self._stream):
            if as_str(g["name"]) == self.group:
                return as_str(g["last-delivered-id"])
        return "0-0"

    def _ensure_group(self) -> None:
        """Creates the consumer group at id 0: groups published before the first learner
        started are read too."""
        try:
            self.client.xgroup_create(self._stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def rearm(self, held: Collection[str], committed: Collection[str]) -> None:
        """After a Redis outage: claim this consumer group's pending entries again, as on
        start-up, so entries delivered to a read that then failed do not wait for the next
        restart. ``held`` (trained, awaiting their checkpoint) are never handed out again
        nor acked here; ``committed`` (acked before, which a restarted Redis may have
        forgotten) are acked again, not trained."""
        self._startup_claim, self._cursor = True, "-"
        self._claim_end = self._last_delivered()
        self._held, self._committed = set(held), set(committed)

    def read_batch(self, n_groups: int, current_version: int, timeout_s: float,
                   on_delivered: Callable[[int], None] | None = None,
                   count_to: tuple[str, str] | None = None) -> Batch:
        """Up to ``n_groups`` groups: reclaimed pending entries first, then new ones, blocking
        at most ``timeout_s`` in all (fewer groups, possibly none, when it runs out).
        ``count_to`` (a hash and its field): the number of entries delivered to this batch so
        far is written there in the same atomic step that takes them from the stream (the
        ``DELIVER`` script); the learner counts them as ``training``
        (``gspo_rl.contract.admission``), so that the servers' in-flight count never loses them
        between the stream and the step (a gap in which they admitted extra groups that then arrived
        too stale). ``on_delivered(n)``: called with that number after each delivery, before the
        entries are decoded or more are waited for."""
        if n_groups < 1:
            raise ValueError("n_groups must be >= 1")
        deadline = time.monotonic() + max(0.0, timeout_s)
        batch = Batch(groups=[], entry_ids=[], dropped_stale=0, staleness=[])
        reclaimed = self._claim(n_groups)
        if reclaimed:  # pending entries: not in the stream's lag, so no gap to close here
            if count_to is not None:
                self.client.hset(count_to[0], count_to[1], len(reclaimed))
            if on_delivered is not None:
                on_delivered(len(reclaimed))
        self._take(batch, reclaimed, current_version)
        batch.reclaimed = len(batch.groups)
        # Entries are decoded once the batch is full (or the time is up): one MGET of the
        # records for the whole batch, not one per delivery; drops (stale, unreadable) are
        # then made up for while time remains.
        read: _Entries = []
        while len(batch.groups) < n_groups:
            have = len(batch.groups) + len(read)
            entries, since = self._deliver(n_groups - have, have, count_to)
            if entries:
                read += entries
                if on_delivered is not None:
                    on_delivered(have + len(entries))
                if have + len(entries) >= n_groups:
                    self._take(batch, read, current_version)
                    read = []
                continue
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                break
            # 1 s slices: under any sane socket timeout (XREAD delivers nothing: it only
            # returns once an entry newer than the group's last-delivered id exists)
            self.client.xread({self._stream: since}, count=1, block=min(remaining_ms, 1000))
        if read:
            self._take(batch, read, current_version)
        return batch

    def _deliver(self, count: int, have: int,
                 count_to: tuple[str, str] | None) -> tuple[_Entries, str]:
        """New entries (``DELIVER``), as redis-py's XREADGROUP gives them, and where a wait for
        more starts (the group's last-delivered id) when there were none."""
        counted = ({"count_field": count_to[1], "delivered": have} if count_to else {})
        keys, args = DELIVER.slots(
            keys={"stream_key": self._stream, **({"count_key": count_to[0]} if count_to else {})},
            args={"consumer_group": self.group, "consumer": self.consumer, "count": count,
                  **counted})
        raw, since = self._deliver_script(keys=keys, args=args)
        entries: _Entries = [(eid, dict(zip(flat[::2], flat[1::2], strict=True)))
                             for eid, flat in raw]
        return entries, as_str(since) if since is not None else "0-0"

    def _resolve(self, entries: _Entries) -> list[tuple[str, ReadyGroup | None]]:
        """Each entry's group (None: unreadable): inline ones decoded as they are,
        by-reference ones from their head and records (one key per group recorded whole, one
        per rollout otherwise), fetched for the whole batch with one MGET."""
        refs: list[tuple[str, EntryRefs | None, bytes | None]] = []
        wanted: list[str] = []
        for raw_id, fields in entries:
            entry_id, fields = as_str(raw_id), fields or {}
            ref = ready_entry_refs(self.keys, fields)
            refs.append((entry_id, ref, fields.get(READY_STREAM_FIELD.encode())))
            if ref is not None:
                wanted += ref.keys
        blobs = iter(cast("list[bytes | None]", self.client.mget(wanted)) if wanted else [])
        out: list[tuple[str, ReadyGroup | None]] = []
        for entry_id, ref, inline in refs:
            values = [next(blobs) for _ in ref.keys] if ref is not None else []
            try:  # a corrupt record must not stop the learner: ack, count, log
                if ref is not None:
                    group = unpack_entry(ref, values)
                    if group is None:
                        logger.error("ready-group entry %s: rollout records missing", entry_id)
                else:
                    group = unpack_ready_group(inline) if inline is not None else None
            except Exception:
                logger.exception("unreadable ready-group entry %s", entry_id)
                group = None
            out.append((entry_id, group))
        return out

    def _take(self, batch: Batch, entries: _Entries, current_version: int) -> None:
        """Decodes entries into ``batch``; stale and unreadable ones are acked and counted."""
        drop: list[str] = []
        stale = 0
        todo = [e for e in entries
                if as_str(e[0]) not in self._held and as_str(e[0]) not in self._committed]
        drop += [as_str(e[0]) for e in entries if as_str(e[0]) in self._committed
                 and as_str(e[0]) not in self._held]
        for entry_id, group in self._resolve(todo):
            if group is None:
                batch.dropped_malformed.append(entry_id)
                drop.append(entry_id)
                continue
            min_v = group.min_version()
            staleness = self.lineage.staleness(current_version, min_v) if min_v >= 0 else 0
            if self.max_staleness is not None and staleness > self.max_staleness:
                stale += 1
                drop.append(entry_id)
                continue
            batch.groups.append(group)
            batch.entry_ids.append(entry_id)
            batch.staleness.append(staleness)
        batch.dropped_stale += stale
        if drop:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.xack(self._stream, self.group, *drop)
                if stale:
                    pipe.hincrby(self.keys.counters, "groups_dropped_stale", stale)
                pipe.execute()

    def _claim(self, limit: int) -> _Entries:
        """Pending entries to redeliver, oldest first, at most ``limit``: on startup every
        pending entry of the consumer group; later those of other consumers idle longer than
        ``claim_idle_s``. Entries deleted from the stream are acked and skipped."""
        if self._startup_claim:
            rows = cast("_Pending", self.client.xpending_range(
                self._stream, self.group, self._cursor, self._claim_end, limit))
            if len(rows) < limit:
                self._startup_claim = False  # everything pending at startup is now ours
            if rows:
                self._cursor = f"({as_str(rows[-1]['message_id'])}"  # exclusive: next page
        else:
            idle_ms = int(self.claim_idle_s * 1000)
            rows = [r for r in cast("_Pending", self.client.xpending_range(
                self._stream, self.group, "-", "+", _CLAIM_PAGE, idle=idle_ms))
                if as_str(r["consumer"]) != self.consumer][:limit]
        if not rows:
            return []
        ids: list[StreamIdT] = [as_str(r["message_id"]) for r in rows]
        # entries, not ids (no JUSTID)
        claimed = cast("_Entries", self.client.xclaim(self._stream, self.group, self.consumer,
                                                      0, ids))
        got = {as_str(i) for i, _ in claimed}
        gone = [i for i in ids if i not in got]
        if gone:  # trimmed or deleted while pending: nothing to train
            self.client.xack(self._stream, self.group, *gone)
        claimed.sort(key=lambda e: _id_key(as_str(e[0])))
        return claimed

    def ack(self, entry_ids: Sequence[str]) -> None:
        """Acknowledges entries (idempotent: acking twice, or an unknown id, is a no-op), then
        trims the stream below what every consumer group still needs, deleting the trimmed
        entries' rollout records: one script, one round trip."""
        self._ack_and_trim(entry_ids)

    def _ack_and_trim(self, entry_ids: Sequence[str]) -> int:
        (r_head, r_tail), (b_head, b_tail) = self._r_tpl, self._b_tpl
        keys, args = ACK_AND_TRIM.slots(
            keys={"stream_key": self._stream, "counters_key": self.keys.counters},
            args={"consumer_group": self.group, "r_head": r_head, "r_tail": r_tail,
                  "ids_field": READY_COUNT_FIELD, "keep_s": self.keep_trained_s,
                  "b_head": b_head, "b_tail": b_tail, "records_field": READY_RECORDS_FIELD},
            rest=list(entry_ids))
        newly, trimmed = self._ack_trim(keys=keys, args=args)
        return int(trimmed)

    def drop_invalid(self, entry_ids: Sequence[str]) -> None:
        """Acknowledges entries that can never be trained (a poison group must not crash the
        learner on every restart) and counts them as ``groups_dropped_invalid``."""
        if not entry_ids:
            return
        with self.client.pipeline(transaction=True) as pipe:
            pipe.xack(self._stream, self.group, *entry_ids)
            pipe.hincrby(self.keys.counters, "groups_dropped_invalid", len(entry_ids))
            pipe.execute()

    def trim(self) -> int:
        """``XTRIM MINID`` at the oldest id any consumer group still needs (with the trimmed
        entries' rollout records); returns how many entries were removed."""
        return self._ack_and_trim([])

    def pending_ids(self) -> list[str]:
        """Ids delivered to this consumer and not yet acknowledged, oldest first."""
        out: list[str] = []
        start = "-"
        while True:
            rows: _Pending = self.client.xpending_range(self._stream, self.group, start, "+", 1000,
                                              consumername=self.consumer)
            out += [as_str(r["message_id"]) for r in rows]
            if len(rows) < 1000:
                return out
            ms, seq = _id_key(out[-1])
            start = f"{ms}-{seq + 1}"
