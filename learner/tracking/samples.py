"""Tables of sampled episodes for the trackers: every ``samples_every`` steps, one row per group
of the step's batch (its first rollout: the rollouts of a group are exchangeable, so the first
is a fair sample of it), at most ``MAX_ROWS`` rows.

A row (``COLUMNS``): ``step``; ``group`` (id); ``task`` (the group metadata's ``task_id``, ""
without one); ``prompt`` and ``completion``, decoded with the model's tokenizer, special tokens
kept (what the model saw and wrote, its end-of-sequence token included); ``reward``;
``advantage`` (the rollout's); ``versions`` (the policy versions of its sampled tokens, "3" or
"2-3"); ``staleness`` (the group's, in updates, as the step counted it); ``turns`` (model
turns). In a multi-turn completion each part is marked: ``[model]`` for the model's turns,
``[env]`` for what the environment (tools, users, the template) put between them. Text is
capped at ``MAX_CHARS``: a prompt keeps its end (the question), a completion its start and end.

``SampleLogger`` is the learner's one call per step; it loads the tokenizer on first use (one
that fails to load leaves the token ids as text, said once). ``markdown_table`` renders rows for
TensorBoard. Building a table never stops training: a failure is logged once.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from gspo_rl.contract.schema import ReadyGroup, RolloutRecord
    from gspo_rl.learner.tracking.base import Tracker
    from gspo_rl.redisq.ready.reader import Batch

log = logging.getLogger(__name__)
MAX_ROWS = 8
MAX_CHARS = 2000
COLUMNS = ("step", "group", "task", "prompt", "completion", "reward", "advantage", "versions",
           "staleness", "turns")
Decode = Callable[[list[int]], str]


def cap(text: str, limit: int = MAX_CHARS, keep: str = "both") -> str:
    """``text`` cut to about ``limit`` characters, the cut marked with an ellipsis: ``keep``
    "head", "tail" or "both" (its start and its end)."""
    if len(text) <= limit:
        return text
    if keep == "head":
        return text[:limit] + " …"
    if keep == "tail":
        return "… " + text[-limit:]
    half = limit // 2
    return text[:half] + " … " + text[-half:]


def _versions(r: RolloutRecord) -> str:
    sampled = [int(v) for v, m in zip(r.versions.tolist(), r.loss_mask.tolist(), strict=False)
               if m]
    if not sampled:
        return ""
    lo, hi = min(sampled), max(sampled)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def completion_text(r: RolloutRecord, decode: Decode) -> str:
    """The tokens after the prompt, decoded; with more than one model turn (or environment
    tokens after the first), each part marked ``[model]`` or ``[env]``."""
    ids = [int(t) for t in r.token_ids.tolist()]
    spans = [(int(s), int(e)) for s, e in r.turns] or [(r.prompt_len, len(ids))]
    parts: list[tuple[str, str]] = []
    at = r.prompt_len
    for start, end in spans:
        if start > at:
            parts.append(("env", decode(ids[at:start])))
        parts.append(("model", decode(ids[max(start, at):end])))
        at = max(at, end)
    if at < len(ids):
        parts.append(("env", decode(ids[at:])))
    if len(parts) == 1:
        return parts[0][1]
    return "\n".join(f"[{who}] {text}" for who, text in parts)


def sample_row(g: ReadyGroup, staleness: int, decode: Decode, step: int) -> dict[str, Any]:
    """The row of group ``g``: its first rollout (module docstring)."""
    r = g.rollouts[0]
    meta = g.metadata if isinstance(g.metadata, dict) else {}
    ids = [int(t) for t in r.token_ids.tolist()]
    return {"step": step, "group": g.group_id, "task": str(meta.get("task_id") or ""),
            "prompt": cap(decode(ids[:r.prompt_len]), keep="tail"),
            "completion": cap(completion_text(r, decode)),
            "reward": float(g.rewards[0]) if g.rewards else float("nan"),
            "advantage": float(g.advantages[0]) if g.advantages else float("nan"),
            "versions": _versions(r), "staleness": int(staleness),
            "turns": max(1, len(r.turns))}


def sample_rows(groups: Sequence[ReadyGroup], staleness: Sequence[int], decode: Decode,
                step: int, max_rows: int = MAX_ROWS) -> list[dict[str, Any]]:
    """One row per group (those with a rollout), the first ``max_rows`` groups."""
    rows: list[dict[str, Any]] = []
    for g, s in zip(groups, staleness, strict=False):
        if g.rollouts and len(rows) < max_rows:
            rows.append(sample_row(g, s, decode, step))
    return rows


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value)).replace("|", "\\|").replace("\n", "<br>")


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table (text escaped; line breaks as ``<br>``)."""
    if not rows:
        return ""
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


class SampleLogger:
    """Every ``every`` steps (0: never), the step's table of sampled episodes to the
    trackers; the tokenizer of ``tokenizer_src`` (a model or checkpoint directory) decodes."""

    def __init__(self, every: int, tokenizer_src: str | Path) -> None:
        self.every = every
        self.tokenizer_src = tokenizer_src
        self._decode: Decode | None = None
        self._failed = False

    def log(self, tracker: Tracker | None, step: int, batch: Batch) -> None:
        """The table of ``batch`` at ``step``, when one is due and a tracker is open."""
        if tracker is None or self.every <= 0 or step % self.every or not batch.groups:
            return
        try:
            rows = sample_rows(batch.groups, batch.staleness, self.decoder(), step)
        except Exception as exc:  # noqa: BLE001 - a table must not stop training
            if not self._failed:
                self._failed = True
                log.warning("sampled episodes not tabulated (%s: %s); training goes on",
                            type(exc).__name__, exc)
            return
        tracker.log_samples(step, rows)

    def decoder(self) -> Decode:
        """The tokenizer's ``decode`` (loaded once); the ids as text when it does not load."""
        if self._decode is None:
            try:
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(str(self.tokenizer_src))
                self._decode = lambda ids: cast(  # (token ids: one text)
                    str, tok.decode(ids, skip_special_tokens=False))
            except (OSError, ValueError) as exc:
                log.warning("no tokenizer in %s (%s): sampled episodes show token ids",
                            self.tokenizer_src, exc)
                self._decode = lambda ids: " ".join(map(str, ids))
        return self._decode
