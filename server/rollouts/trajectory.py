"""A group's trajectories as a person reads them: ``GET /v1/groups/{id}?include=tokens``.

For each rollout: the token ids, loss mask (1 = sampled by the model, trained on), behaviour
log-probabilities and per-token policy versions, the model turns' ``[start, end)`` spans with
the decoded text of each turn and of the context before it (prompt, tool results, template
tokens), and, once the group is published, the advantages the learner trains on: one per
rollout (``--loss gspo``) and one per model turn (the per-token losses: gspo_token, grpo,
sapo; ``gspo_rl.contract.turn_advantages``, the learner's own function). A published
group is read from its ready-stream entry and the rollout records it references, the very bytes
the learner trains on; otherwise from the rollout records. Once the learner has trained a group
and trimmed its entry, its records stay readable for
``gspo_rl.redisq.ready.reader.KEEP_TRAINED_S`` (600 s; without the advantage, which lived in
the entry), then its trajectories read as expired (None). Read-only.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from pydantic import BaseModel

from gspo_rl.contract.schema import (
    READY_STREAM_FIELD,
    ReadyGroup,
    RolloutRecord,
    unpack_ready_group,
    unpack_rollout,
)
from gspo_rl.contract.turn_advantages import ready_turn_advantages
from gspo_rl.redisq.groups.store import RolloutStore
from gspo_rl.redisq.ready.entry import ready_entry_refs, unpack_entry, unpack_group_records


class TurnOut(BaseModel):
    start: int
    end: int
    """``[start, end)``: the model's tokens of this turn in ``token_ids``."""
    context_text: str
    """Decoded tokens between the previous turn (or the start) and this one: the prompt, tool
    results, user messages, template markup (loss mask 0)."""
    text: str
    """Decoded tokens the model sampled in this turn (loss mask 1), special tokens kept."""
    advantage: float | None = None
    """The advantage every token of this turn trains with under the per-token losses
    (gspo_token, grpo, sapo); published groups only."""


class TrajectoryOut(BaseModel):
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    """Behaviour log-probability of each sampled token (0.0 where the mask is 0)."""
    versions: list[int]
    """Policy version that sampled each token (-1 where the mask is 0)."""
    prompt_len: int
    temperature: float
    finish_reason: str
    turns: list[TurnOut]
    advantage: float | None = None
    """The rollout's sequence advantage (``--loss gspo``; published groups only)."""
    turn_advantages: list[float] | None = None
    """One per model turn (as ``turns[k].advantage``): what the per-token losses train each
    turn with; they differ between turns when episodes post turn rewards. Published groups
    only."""
    source: str
    """"ready_stream" (what the learner reads) or "rollout" (the stored record)."""


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=False))


def trajectory_out(rec: RolloutRecord, tokenizer: Any, advantage: float | None,
                   source: str, turn_adv: list[float] | None = None) -> TrajectoryOut:
    ids = rec.token_ids.tolist()
    turns, prev = [], 0
    for k, (start, end) in enumerate(rec.turns):
        turns.append(TurnOut(start=start, end=end, context_text=_decode(tokenizer, ids[prev:start]),
                             text=_decode(tokenizer, ids[start:end]),
                             advantage=None if turn_adv is None else turn_adv[k]))
        prev = end
    return TrajectoryOut(
        token_ids=ids, loss_mask=rec.loss_mask.astype(int).tolist(),
        logprobs=rec.logprobs.astype(float).tolist(), versions=rec.versions.tolist(),
        prompt_len=rec.prompt_len, temperature=rec.temperature,
        finish_reason=rec.finish_reason, turns=turns, advantage=advantage,
        turn_advantages=turn_adv, source=source)


_Published = dict[str, tuple[RolloutRecord, float, list[float] | None]]


def _per_turn(group: ReadyGroup) -> list[list[float] | None]:
    """Each rollout's per-turn advantages as the learner computes them (None for a rollout
    whose counts do not match: the learner drops such a group as invalid)."""
    try:
        per_turn = ready_turn_advantages(group)
    except ValueError:
        return [None] * len(group.rollouts)
    return [a.tolist() if len(a) == len(r.turns) else None
            for r, a in zip(group.rollouts, per_turn, strict=True)]


async def _published(store: RolloutStore, stream_id: str) -> _Published:
    # (redis-py types replies bytes | str and an entry's fields optional: these are bytes,
    # decode_responses=False, and XRANGE's fields never nil)
    entries = cast("list[tuple[bytes, dict[bytes, bytes]]]",
                   await store.redis.xrange(store.keys.ready_stream, stream_id, stream_id))
    if not entries:  # trimmed from the stream: fall back to the records
        return {}
    fields = entries[0][1]
    ref = ready_entry_refs(store.keys, fields)
    if ref is not None:  # published by reference: the records are the keys it names
        group = unpack_entry(ref, cast("list[bytes | None]", await store.redis.mget(ref.keys)))
    else:
        data = fields.get(READY_STREAM_FIELD.encode())
        group = None if data is None else unpack_ready_group(data)
    if group is None:
        return {}
    return {r.rollout_id: (r, a, t) for r, a, t in zip(group.rollouts, group.advantages,
                                                       _per_turn(group), strict=True)}


async def load_trajectories(store: RolloutStore, tokenizer: Any, group_id: str,
                            rollout_ids: list[str],
                            stream_id: str | None) -> dict[str, TrajectoryOut | None]:
    """Each rollout's trajectory (None: its record has expired)."""
    published = await _published(store, stream_id) if stream_id else {}
    missing = [r for r in rollout_ids if r not in published]
    # the group's one records key (a group recorded whole), else one key per rollout
    whole, *blobs = cast("list[bytes | None]", await store.redis.mget(
        [store.keys.group_records(group_id), *[store.keys.rollout(r) for r in missing]]
    )) if missing else [None]

    def build() -> dict[str, TrajectoryOut | None]:  # decoding: off the event loop
        out: dict[str, TrajectoryOut | None] = {}
        recs = {r.rollout_id: r for r in unpack_group_records(whole)} if whole else {}
        for rid, blob in zip(missing, blobs, strict=True):
            rec = recs.get(rid) or (None if blob is None else unpack_rollout(blob))
            out[rid] = None if rec is None else trajectory_out(rec, tokenizer, None, "rollout")
        for rid, (rec, adv, turn_adv) in published.items():
            out[rid] = trajectory_out(rec, tokenizer, adv, "ready_stream", turn_adv)
        return out

    return await asyncio.to_thread(build)
