"""The learner's side of the simulated fleet: one process that reads batches of ready groups
and acknowledges them, as the learner does (a multiprocessing target).

Contract: ``reader_main`` puts "ready" on ``out`` once its consumer group exists, then reads
until ``n_groups`` groups have come (or nothing came for ``stall_s``), then puts a dict: its
CPU seconds from "ready" to the end (``time.process_time``: this process's own cost, whatever
else runs on the machine), groups, samples and tokens read, unreadable groups, and when it
finished (``time.time``). ``mode="ours"``: ``GroupReader.read_batch`` (DELIVER script, one MGET
of the batch's records, decode) + ``ack`` (ACK_AND_TRIM, the records kept
``keep_trained_s``); ``mode="raw"``: XREADGROUP + XACK of the same entries, not decoded.
``step_s``: a pause after each batch (the training step); 0 reads as fast as it can.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any


def _read_ours(reader: Any, want: int) -> tuple[int, int, int, int]:
    """One batch: (groups, samples, tokens, unreadable)."""
    b = reader.read_batch(want, current_version=0, timeout_s=1.0)
    reader.ack([*b.entry_ids, *b.dropped_malformed])
    samples = sum(len(g.rollouts) for g in b.groups)
    tokens = sum(len(r.token_ids) for g in b.groups for r in g.rollouts)
    return len(b.groups), samples, tokens, len(b.dropped_malformed)


def _read_raw(client: Any, stream: str, group: str, want: int) -> int:
    res = client.xreadgroup(group, "raw", {stream: ">"}, count=want, block=1000)
    if not res:
        return 0
    ids = [i for i, _ in res[0][1]]
    client.xack(stream, group, *ids)
    return len(ids)


def reader_main(url: str, mode: str, n_groups: int, batch_groups: int, group_size: int,
                step_s: float, stall_s: float, out: Any) -> None:
    """Process target (module docstring)."""
    import redis

    from gspo_rl.contract.gc_freeze import freeze_startup_objects
    from gspo_rl.contract.schema import LEARNER_CONSUMER_GROUP, Keys
    from gspo_rl.redisq.ready.reader import GroupReader

    client = redis.Redis.from_url(url)
    stream = Keys().ready_stream
    reader = None
    if mode == "ours":
        reader = GroupReader(client)
    else:
        with contextlib.suppress(redis.ResponseError):
            client.xgroup_create(stream, LEARNER_CONSUMER_GROUP, id="0", mkstream=True)
    freeze_startup_objects()  # as the learner does once started
    out.put("ready")
    cpu0, last = time.process_time(), time.monotonic()
    got = samples = tokens = bad = 0
    while got < n_groups and time.monotonic() - last < stall_s:
        want = min(batch_groups, n_groups - got)
        if reader is not None:
            g, s, t, u = _read_ours(reader, want)
            samples, tokens, bad = samples + s, tokens + t, bad + u
        else:
            g = _read_raw(client, stream, LEARNER_CONSUMER_GROUP, want)
            samples += g * group_size
        got += g
        if g:
            last = time.monotonic()
            if step_s > 0:
                time.sleep(step_s)
    cpu = time.process_time() - cpu0
    client.close()
    out.put({"cpu_s": cpu, "groups": got, "samples": samples, "tokens": tokens,
             "unreadable": bad, "end": time.time(), "stalled": got < n_groups})
