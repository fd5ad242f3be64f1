"""GroupReader against a real Redis: batches, staleness, acks, trimming, crash and reclaim."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from gspo_rl.contract.admission import FIELD_TRAINING
from gspo_rl.contract.schema import Keys
from gspo_rl.redisq.ready.reader import KEEP_TRAINED_S, GroupReader
from tests.helpers.queue import publish_groups

KEYS = Keys()


def publish(url: str, names: list[str], version: int = 0) -> list[str]:
    return asyncio.run(publish_groups(url, names, version=version))


def counter(r: redis.Redis, name: str) -> int:
    return int(r.hget(KEYS.counters, name) or 0)


def test_batches_come_in_order_and_shorter_on_timeout(redis_url: str, r: redis.Redis) -> None:
    reader = GroupReader(r)
    ids = publish(redis_url, [f"g{i}" for i in range(5)])
    b1 = reader.read_batch(3, current_version=0, timeout_s=10)
    assert [g.group_id for g in b1.groups] == ["g0", "g1", "g2"]
    assert b1.entry_ids == ids[:3] and b1.staleness == [0, 0, 0] and b1.dropped_stale == 0
    assert b1.groups[0].advantages == pytest.approx([-1.3416, -0.4472, 0.4472, 1.3416], abs=1e-3)
    b2 = reader.read_batch(3, current_version=0, timeout_s=0.2)
    assert b2.entry_ids == ids[3:]  # only two left: fewer groups on timeout
    assert reader.read_batch(3, current_version=0, timeout_s=0.1).groups == []
    assert reader.pending_ids() == ids
    reader.ack(ids[:3])
    reader.ack(ids[:3])  # idempotent
    assert reader.pending_ids() == ids[3:]
    assert counter(r, "groups_acked") == 3


def test_delivered_entries_are_reported_before_the_read_waits_for_more(
        redis_url: str, r: redis.Redis) -> None:
    """The learner publishes these counts as ``training`` (admission): a group that left the
    stream must count as in flight at once, not only once the whole batch has arrived."""
    reader = GroupReader(r)
    publish(redis_url, ["g0"])
    reported: list[tuple[int, int]] = []  # (count, groups in the stream still unread)

    def on_delivered(n: int) -> None:
        info = r.xinfo_groups(KEYS.ready_stream)[0]
        reported.append((n, int(info["lag"])))
        if len(reported) == 1:  # the second group arrives while the read waits for it
            threading.Thread(target=publish, args=(redis_url, ["g1"])).start()

    batch = reader.read_batch(2, current_version=0, timeout_s=60, on_delivered=on_delivered)
    assert [g.group_id for g in batch.groups] == ["g0", "g1"]
    assert reported == [(1, 0), (2, 0)]


def test_the_training_count_moves_with_the_delivery_in_one_step(
        redis_url: str, r: redis.Redis) -> None:
    """``count_to`` (what the learner passes): at no moment does a group that left the stream
    count nowhere. A poller reads what the admission gate reads (the consumer group's
    delivered count, and the learner's ``training`` field) in one MULTI, over and over, while
    groups trickle in and one read takes them one delivery at a time. (With the count written
    by a second round trip after each XREADGROUP, as before, the poller sees the gap.)"""
    reader = GroupReader(r)
    names = [f"t{i}" for i in range(12)]
    done = threading.Event()
    samples: list[tuple[int, int]] = []

    def poll() -> None:
        client = redis.Redis.from_url(redis_url)
        while not done.is_set():
            with client.pipeline(transaction=True) as p:
                info, training = p.xinfo_groups(KEYS.ready_stream).hget(
                    KEYS.learner_state, FIELD_TRAINING).execute()
            samples.append((int(info[0]["entries-read"] or 0), int(training or 0)))
        client.close()

    def produce() -> None:
        for name in names:
            publish(redis_url, [name])

    threads = [threading.Thread(target=poll), threading.Thread(target=produce)]
    for t in threads:
        t.start()
    try:
        batch = reader.read_batch(len(names), current_version=0, timeout_s=60,
                                  count_to=(KEYS.learner_state, FIELD_TRAINING))
    finally:
        done.set()
        for t in threads:
            t.join(timeout=60)
    assert [g.group_id for g in batch.groups] == names
    gaps = [s for s in samples if s[0] != s[1]]
    assert not gaps, f"{len(gaps)} of {len(samples)} reads saw delivered != training: {gaps[:5]}"
    assert len(samples) > 20
    info = r.xinfo_groups(KEYS.ready_stream)[0]
    assert int(info["entries-read"]) == int(r.hget(KEYS.learner_state, FIELD_TRAINING)) == 12


def test_blocking_read_gets_groups_published_meanwhile(redis_url: str, r: redis.Redis) -> None:
    reader = GroupReader(r)
    t = threading.Thread(target=publish, args=(redis_url, ["late0", "late1"]))
    t.start()
    batch = reader.read_batch(2, current_version=0, timeout_s=60)
    t.join(timeout=60)
    assert [g.group_id for g in batch.groups] == ["late0", "late1"]


def test_stale_groups_are_dropped_acked_and_counted(redis_url: str, r: redis.Redis) -> None:
    publish(redis_url, ["v0"], version=0)
    kept = publish(redis_url, ["v3"], version=3) + publish(redis_url, ["v5"], version=5)
    reader = GroupReader(r, max_staleness=2)
    batch = reader.read_batch(3, current_version=5, timeout_s=0.3)
    assert [g.group_id for g in batch.groups] == ["v3", "v5"]
    assert batch.staleness == [2, 0] and batch.dropped_stale == 1
    assert reader.pending_ids() == kept  # the stale one is acked
    assert counter(r, "groups_dropped_stale") == 1
    unbounded = GroupReader(r, group="other")  # max_staleness=None keeps everything
    assert len(unbounded.read_batch(3, current_version=100, timeout_s=0.3).groups) == 3


def test_crash_and_reclaim_train_every_group_exactly_once(redis_url: str,
                                                          r: redis.Redis) -> None:
    ids = publish(redis_url, [f"g{i}" for i in range(10)])
    committed: list[str] = []  # ids of groups whose training step is in a saved checkpoint

    a = GroupReader(r, consumer="learner-0")
    c1 = a.read_batch(2, 0, 5).entry_ids + a.read_batch(2, 0, 5).entry_ids
    committed += c1  # checkpoint 1 saved with these ids, then acked
    a.ack(c1)
    c2 = a.read_batch(2, 0, 5).entry_ids
    committed += c2  # checkpoint 2 saved ... and the process dies before the ack
    del a

    b = GroupReader(r, consumer="learner-0")  # restart under the same name
    b.ack(c2)  # resume protocol: ack what the checkpoint says was trained
    lost = b.read_batch(2, 0, 5)  # trained, then the process dies before any checkpoint
    assert lost.reclaimed == 0 and lost.entry_ids == ids[6:8]
    del b

    c = GroupReader(r, consumer="learner-1")  # restart under another name
    c.ack(c2)  # idempotent
    redo = c.read_batch(3, 0, 5)
    assert redo.reclaimed == 2 and redo.entry_ids == ids[6:9]  # pending first, then new
    committed += redo.entry_ids
    c.ack(redo.entry_ids)
    rest = c.read_batch(5, 0, 0.2)
    committed += rest.entry_ids
    c.ack(rest.entry_ids)
    assert committed == ids  # every group in exactly one committed step
    assert c.pending_ids() == [] and r.xpending(KEYS.ready_stream, "learners")["pending"] == 0
    assert r.xlen(KEYS.ready_stream) == 0  # acked entries are trimmed


def test_startup_claim_pages_through_many_pending(redis_url: str, r: redis.Redis) -> None:
    ids = publish(redis_url, [f"g{i}" for i in range(7)])
    dead = GroupReader(r, consumer="dead")
    assert dead.read_batch(7, 0, 5).entry_ids == ids
    new = GroupReader(r, consumer="new")
    got = [new.read_batch(3, 0, 0.1) for _ in range(4)]
    assert [b.entry_ids for b in got] == [ids[:3], ids[3:6], ids[6:], []]
    assert [b.reclaimed for b in got] == [3, 3, 1, 0]
    assert new.pending_ids() == ids and dead.pending_ids() == []


def test_idle_entries_of_another_consumer_are_claimed_not_own(redis_url: str,
                                                              r: redis.Redis) -> None:
    ids = publish(redis_url, [f"g{i}" for i in range(3)])
    a = GroupReader(r, consumer="a")
    assert a.read_batch(2, 0, 5).entry_ids == ids[:2]
    b = GroupReader(r, consumer="b", claim_all_on_start=False, claim_idle_s=0.0)
    got = b.read_batch(3, 0, 5)
    assert got.entry_ids == ids and got.reclaimed == 2
    again = b.read_batch(3, 0, 0.1)  # b's own pending entries are never redelivered to it
    assert again.entry_ids == []
    assert b.pending_ids() == ids


def test_trim_keeps_what_any_consumer_group_still_needs(redis_url: str,
                                                        r: redis.Redis) -> None:
    ids = publish(redis_url, [f"g{i}" for i in range(6)])
    reader = GroupReader(r)
    batch = reader.read_batch(4, 0, 5)
    reader.ack(batch.entry_ids[1:3])  # the oldest delivered one is still pending
    assert r.xlen(KEYS.ready_stream) == 6
    reader.ack(batch.entry_ids[:1])
    assert r.xlen(KEYS.ready_stream) == 3  # g3 pending, g4 and g5 undelivered
    reader.ack(batch.entry_ids[3:])
    assert [i.decode() for i, _ in r.xrange(KEYS.ready_stream)] == ids[4:]
    GroupReader(r, group="eval")  # a second consumer group that has read nothing yet
    last = reader.read_batch(2, 0, 5)
    reader.ack(last.entry_ids)
    assert r.xlen(KEYS.ready_stream) == 2  # kept for "eval"


def test_unreadable_entries_are_acked_and_reported(redis_url: str, r: redis.Redis) -> None:
    bad = r.xadd(KEYS.ready_stream, {"group": b"\xc1not msgpack"}).decode()
    ids = publish(redis_url, ["ok"])
    reader = GroupReader(r)
    batch = reader.read_batch(1, 0, 5)
    assert batch.entry_ids == ids and batch.dropped_malformed == [bad]
    assert reader.pending_ids() == ids


def test_memory_is_bounded_after_a_full_cycle(redis_url: str, r: redis.Redis) -> None:
    reader = GroupReader(r)
    publish(redis_url, [f"g{i}" for i in range(4)])
    reader.ack(reader.read_batch(4, 0, 5).entry_ids)
    assert r.xlen(KEYS.ready_stream) == 0
    records = [KEYS.rollout(f"g{i}-r{j}") for i in range(4) for j in range(4)]
    assert all(0 < r.ttl(k) <= KEEP_TRAINED_S for k in records)  # expiring with their entries
    for key in r.scan_iter("*"):
        name = key.decode()
        if name in (KEYS.counters, KEYS.finished_rewards, KEYS.ready_stream):
            continue  # fixed-size totals, and the stream
        assert r.ttl(name) > 0, f"{name} has no TTL"


def test_startup_claim_never_redelivers_what_this_reader_read(redis_url: str,
                                                              r: redis.Redis) -> None:
    old = publish(redis_url, [f"old{i}" for i in range(3)], version=0)
    assert GroupReader(r, consumer="dead").read_batch(3, 0, 5).entry_ids == old
    new = publish(redis_url, ["new0", "new1"], version=5)
    reader = GroupReader(r, consumer="learner-0", max_staleness=2)
    first = reader.read_batch(3, current_version=5, timeout_s=0.5)
    # A full page of pending entries, all stale: the batch is filled from new entries.
    assert first.dropped_stale == 3 and first.entry_ids == new
    # The next page of the startup claim must not hand the same (unacked) entries out again.
    again = reader.read_batch(3, current_version=5, timeout_s=0.2)
    assert again.entry_ids == [] and again.dropped_stale == 0
    assert reader.pending_ids() == new and counter(r, "groups_dropped_stale") == 3


def test_rearm_after_an_outage_reclaims_lost_reads_not_held_ones(redis_url: str,
                                                                r: redis.Redis) -> None:
    ids = publish(redis_url, [f"g{i}" for i in range(4)])
    reader = GroupReader(r, consumer="learner-0")
    held = reader.read_batch(1, 0, 5).entry_ids  # trained, awaiting its checkpoint
    committed = reader.read_batch(1, 0, 5).entry_ids  # acked, but Redis lost the ack
    lost = reader.read_batch(1, 0, 5).entry_ids  # delivered to a read that then failed
    assert reader.read_batch(1, 0, 0.1).entry_ids == ids[3:]  # (trained and acked)
    reader.ack(ids[3:])
    # Without rearm the lost entry would wait for the next restart: own pending entries are
    # never handed out again while the reader runs.
    assert reader.read_batch(3, 0, 0.1).entry_ids == []
    reader.rearm(held=held, committed=committed)
    batch = reader.read_batch(3, 0, 0.2)
    assert batch.entry_ids == lost and batch.reclaimed == 1
    assert reader.pending_ids() == held + lost  # the committed one is acked again
    assert counter(r, "groups_dropped_stale") == 0


def test_drop_invalid_acks_and_counts_only_those(redis_url: str, r: redis.Redis) -> None:
    ids = publish(redis_url, ["poison", "fine"])
    reader = GroupReader(r)
    assert reader.read_batch(2, 0, 5).entry_ids == ids
    reader.drop_invalid([ids[0]])
    assert reader.pending_ids() == [ids[1]]
    assert counter(r, "groups_dropped_invalid") == 1
    reader.drop_invalid([])
    assert counter(r, "groups_dropped_invalid") == 1
