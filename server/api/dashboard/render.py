"""One group's episodes as the model saw and wrote them: ``GET /v1/dashboard/groups/{id}``.

The records are read as the learner reads them: through the group's ready-stream entry (the
one the dashboard remembers, ``recent``, or the one the group names) when it was published,
with the advantages of its head (per turn: ``ready_turn_advantages``, the learner's own
function); otherwise from the rollout records, without advantages. Each model turn's tokens
are decoded one by one (``TokenTexts``) with their behaviour log-probability, policy version
and, once the learner trained them, log importance ratio (``Keys.token_ratios``); the context
between turns (prompt, tool results, template tokens) is decoded whole, its middle cut past
``CONTEXT_TOKENS``. The work is bounded: at most ``rollouts`` episodes, at
most ``max_tokens`` model tokens each and ``TOTAL_TOKENS`` in all, decoded off the event loop.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, cast

import msgpack
import numpy as np
from redis.asyncio import Redis

from gspo_rl.contract.ratios import at_positions, unpack_log_ratios
from gspo_rl.contract.schema import (
    READY_STREAM_FIELD,
    ReadyGroup,
    RolloutRecord,
    unpack_ready_group,
    unpack_rollout,
)
from gspo_rl.contract.turn_advantages import ready_turn_advantages
from gspo_rl.redisq.groups.store import RolloutStore
from gspo_rl.redisq.groups.types import GroupView
from gspo_rl.redisq.ready.entry import (
    EntryRefs,
    ready_entry_refs,
    unpack_entry,
    unpack_group_records,
)
from gspo_rl.server.api.dashboard.protocol import GroupDetail, RolloutView, SegmentOut
from gspo_rl.server.api.dashboard.recent import RecentGroups, labels_of
from gspo_rl.server.rollouts.chat.render import TokenTexts

CONTEXT_TOKENS = 384
TOTAL_TOKENS = 16384
_BAD = (KeyError, TypeError, ValueError, msgpack.UnpackException)  # bytes not written here


@dataclass
class Loaded:
    records: dict[str, RolloutRecord]
    ready: ReadyGroup | None
    log_ratios: dict[str, np.ndarray] = field(default_factory=dict)  # those in Redis


async def _published(redis: Redis, recent: RecentGroups, view: GroupView) -> ReadyGroup | None:
    """The group as its ready-stream entry has it (None: not published, or gone)."""
    known = recent.get(view.group_id)
    ref: EntryRefs | None = known.ref if known is not None else None
    try:
        if ref is None and view.stream_id:
            # (bytes replies, decode_responses=False; XRANGE's fields never nil)
            entries = cast("list[tuple[bytes, dict[bytes, bytes]]]", await redis.xrange(
                recent.keys.ready_stream, view.stream_id, view.stream_id))
            if entries:
                fields = entries[0][1]
                ref = ready_entry_refs(recent.keys, fields)
                inline = fields.get(READY_STREAM_FIELD.encode())
                if ref is None and inline is not None:
                    return unpack_ready_group(inline)
        if ref is None:
            return None
        return unpack_entry(ref, cast("list[bytes | None]", await redis.mget(ref.keys)))
    except _BAD:
        return None  # not what this code base writes: shown from the records, if any


async def load(store: RolloutStore, recent: RecentGroups, view: GroupView,
               rollout_ids: list[str]) -> Loaded:
    """The records of ``rollout_ids``: the published ones through the group's entry, the
    others (not published, or the entry gone) from their own keys."""
    ready = await _published(store.redis, recent, view)
    by_id = {r.rollout_id: r for r in ready.rollouts} if ready is not None else {}
    records = {r: by_id[r] for r in rollout_ids if r in by_id}
    missing = [r for r in rollout_ids if r not in records]
    if missing:
        keys = store.keys
        whole, *blobs = cast("list[bytes | None]", await store.redis.mget(
            [keys.group_records(view.group_id), *[keys.rollout(r) for r in missing]]))
        recs = {r.rollout_id: r for r in _records(whole)} if whole else {}
        for rid, blob in zip(missing, blobs, strict=True):
            rec = recs.get(rid) or (None if blob is None else _record(blob))
            if rec is not None:
                records[rid] = rec
    return Loaded(records, ready, await _log_ratios(store, list(records)))


async def _log_ratios(store: RolloutStore, rollout_ids: list[str]) -> dict[str, np.ndarray]:
    """The log-ratios the learner wrote for ``rollout_ids`` (those it trained, unexpired)."""
    if not rollout_ids:
        return {}
    blobs = cast("list[bytes | None]", await store.redis.mget(
        [store.keys.token_ratios(r) for r in rollout_ids]))
    out = {}
    for rid, blob in zip(rollout_ids, blobs, strict=True):
        try:
            if blob is not None:
                out[rid] = unpack_log_ratios(blob)
        except ValueError:
            continue  # not what the learner writes: shown without ratios
    return out


def _records(blob: bytes) -> list[RolloutRecord]:
    """A group's records; [] for bytes that are not (not what this code base writes)."""
    try:
        return unpack_group_records(blob)
    except _BAD:
        return []


def _record(blob: bytes) -> RolloutRecord | None:
    try:
        return unpack_rollout(blob)
    except _BAD:
        return None


def _context(tokenizer: Any, ids: list[int]) -> SegmentOut:
    if len(ids) <= CONTEXT_TOKENS:
        return SegmentOut(kind="context", text=tokenizer.decode(ids, skip_special_tokens=False))
    half = CONTEXT_TOKENS // 2
    cut = len(ids) - 2 * half
    text = (tokenizer.decode(ids[:half], skip_special_tokens=False)
            + f"\n[... {cut} tokens not shown ...]\n"
            + tokenizer.decode(ids[-half:], skip_special_tokens=False))
    return SegmentOut(kind="context", text=text, truncated=cut)


def _finite(values: np.ndarray) -> list[float]:
    return [round(float(x), 4) for x in np.nan_to_num(values.astype(np.float64), nan=0.0,
                                                       posinf=0.0, neginf=-1e4)]


def _optional(values: np.ndarray) -> list[float | None]:
    return [round(x, 4) if math.isfinite(x) else None for x in values.tolist()]


def segments(rec: RolloutRecord, tokenizer: Any, texts: TokenTexts, budget: int,
             turn_adv: list[float] | None, turn_rewards: list[float] | None,
             log_ratios: np.ndarray | None = None) -> list[SegmentOut]:
    """The record's context and model turns, at most ``budget`` model tokens shown
    (``log_ratios``: per position, ``at_positions``)."""
    ids = rec.token_ids.tolist()
    out, prev = [], 0
    for k, (start, end) in enumerate(rec.turns):
        if start > prev:
            out.append(_context(tokenizer, ids[prev:start]))
        shown = max(0, min(end, start + budget) - start)
        budget -= shown
        stop = start + shown
        out.append(SegmentOut(
            kind="model", turn=k, tokens=[texts.text(t) for t in ids[start:stop]],
            logprobs=_finite(rec.logprobs[start:stop]),
            versions=[int(v) for v in rec.versions[start:stop]],
            log_ratios=None if log_ratios is None else _optional(log_ratios[start:stop]),
            advantage=None if turn_adv is None or k >= len(turn_adv) else turn_adv[k],
            reward=(None if turn_rewards is None or k >= len(turn_rewards)
                    else float(turn_rewards[k])),
            truncated=end - stop))
        prev = end
    if prev < len(ids):
        out.append(_context(tokenizer, ids[prev:]))
    return out


def _turn_advantages(ready: ReadyGroup | None) -> dict[str, tuple[float, list[float] | None]]:
    if ready is None:
        return {}
    try:
        per_turn = [a.tolist() for a in ready_turn_advantages(ready)]
    except ValueError:
        per_turn = [None] * len(ready.rollouts)
    return {r.rollout_id: (a, t) for r, a, t in zip(ready.rollouts, ready.advantages, per_turn,
                                                    strict=True)}


def detail(view: GroupView, loaded: Loaded, tokenizer: Any, texts: TokenTexts,
           max_tokens: int, rollout_ids: list[str]) -> GroupDetail:
    """The wire view (runs in a worker thread: decoding holds the GIL, not the loop)."""
    advantages = _turn_advantages(loaded.ready)
    shown = [r for r in rollout_ids if r in loaded.records]
    budget = min(max_tokens, TOTAL_TOKENS // max(1, len(shown)))
    rollouts = []
    for rid in shown:
        rec = loaded.records[rid]
        reward = view.rewards.get(rid) or {}
        seq_adv, turn_adv = advantages.get(rid, (None, None))
        ratios = loaded.log_ratios.get(rid)
        rollouts.append(RolloutView(
            rollout_id=rid, reward=reward.get("reward"), advantage=seq_adv,
            finish_reason=rec.finish_reason, n_tokens=len(rec.token_ids),
            n_model_tokens=int(rec.loss_mask.sum()),
            segments=segments(rec, tokenizer, texts, budget, turn_adv, reward.get("turn_rewards"),
                              None if ratios is None else at_positions(rec.loss_mask, ratios))))
    return GroupDetail(
        group_id=view.group_id, state=view.state, drop_reason=view.drop_reason,
        stream_id=view.stream_id,
        advantages_from="ready_stream" if loaded.ready is not None else "none",
        labels=labels_of(view.metadata), rollouts=rollouts,
        missing=len(rollout_ids) - len(shown))


async def group_detail(store: RolloutStore, recent: RecentGroups, tokenizer: Any,
                       texts: TokenTexts, group_id: str, max_rollouts: int,
                       max_tokens: int) -> GroupDetail | None:
    """The group's view (None: unknown, or its keys have expired)."""
    view = await store.get_group(group_id)
    if view is None:
        return None
    rollout_ids = view.rollout_ids[:max_rollouts]
    loaded = await load(store, recent, view, rollout_ids)
    return await asyncio.to_thread(detail, view, loaded, tokenizer, texts, max_tokens,
                                   rollout_ids)
