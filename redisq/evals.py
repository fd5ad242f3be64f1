"""Evaluation results in Redis: environments post them to a server, the learner logs them.

An evaluation (``gspo_rl.client.evals``) runs on the environment's side, with requests that
are served and not recorded; its result (the eval set's name, the policy version evaluated,
its metrics) travels to the server (``POST /v1/evals``), which appends it to one stream
(``Keys.eval_stream``, at most ``MAX_EVALS`` entries, oldest trimmed). The learner reads the
entries it has not logged yet after each step and writes them to its metrics stream, so every
metrics backend sees them beside the step metrics; its cursor (the last id it logged) is kept
in ``Keys.learner_state`` (``CURSOR_FIELD``), so a restarted learner logs no entry twice and
misses none still in the stream. Entries are JSON objects (``EVAL_FIELD``).
"""

from __future__ import annotations

import json
from typing import Any

from gspo_rl.contract.schema import Keys, as_str

EVAL_FIELD = "eval"
MAX_EVALS = 10_000
CURSOR_FIELD = "evals_logged"


def eval_entry(record: dict[str, Any]) -> dict[str, bytes]:
    """A result as the stream entry's fields."""
    return {EVAL_FIELD: json.dumps(record, separators=(",", ":")).encode()}


def decode_entries(raw: list[tuple[Any, dict[Any, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """``XRANGE``'s reply -> (id, result), skipping an entry that is not ours."""
    out = []
    for entry_id, fields in raw:
        data = fields.get(EVAL_FIELD.encode(), fields.get(EVAL_FIELD))
        if data is None:
            continue
        try:
            record = json.loads(data)
        except (TypeError, ValueError):
            continue
        if isinstance(record, dict):
            out.append((as_str(entry_id), record))
    return out


async def append_eval(client: Any, keys: Keys, record: dict[str, Any]) -> str:
    """Appends one result (the server's side, an asyncio client); returns its id."""
    entry_id = await client.xadd(keys.eval_stream, eval_entry(record), maxlen=MAX_EVALS,
                                 approximate=True)
    return as_str(entry_id)


async def list_evals(client: Any, keys: Keys, after: str | None,
                     count: int) -> list[tuple[str, dict[str, Any]]]:
    """Results after ``after`` (None: the newest ``count``), oldest first."""
    if after is None:
        raw = await client.xrevrange(keys.eval_stream, count=count)
        return decode_entries(list(reversed(raw)))
    return decode_entries(await client.xrange(keys.eval_stream, min=f"({after}", count=count))


def read_unlogged(client: Any, keys: Keys, count: int = 100) -> list[tuple[str, dict[str, Any]]]:
    """The learner's side (a synchronous client): results after its cursor, oldest first."""
    cursor = as_str(client.hget(keys.learner_state, CURSOR_FIELD)) or "0-0"
    return decode_entries(client.xrange(keys.eval_stream, min=f"({cursor}", count=count))


def mark_logged(client: Any, keys: Keys, entry_id: str) -> None:
    """Moves the learner's cursor past ``entry_id``."""
    client.hset(keys.learner_state, CURSOR_FIELD, entry_id)
