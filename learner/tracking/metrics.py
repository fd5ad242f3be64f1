"""Per-step learner metrics: one terminal line, one JSON line, the experiment trackers.

A step record is a flat dict of floats plus a few structured fields: ``staleness`` (histogram
of the trained groups' staleness), ``dropped`` (totals by reason) and ``dropped_stale_step``,
``env_reward``, ``groups_trained_total``, ``trained_fraction`` and
``trained_fraction_with_signal``, ``time_wait_s`` / ``time_compute_s`` / ``time_sync_s``,
``stalls`` and ``registry_rejected``, ``source/<name>/reward_mean`` and ``.../groups`` when
groups name their task source (tasks from data), and ``group_ids`` / ``entry_ids`` (the JSONL is
also the audit log of exactly-once training). Checkpoints and no-progress states write their
own ``{"event": ...}`` records; evaluations ``{"event": "eval"}`` ones (``eval_record``). Every
record, step or event, also goes to the experiment trackers (``gspo_rl.learner.tracking``), at
its own ``step`` or else the last step logged. Every field explained:
docs/design/learner-loop.md.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from gspo_rl.contract.schema import Keys, ReadyGroup, as_str
from gspo_rl.learner.tracking.base import Tracker
from gspo_rl.redisq.evals import mark_logged, read_unlogged

if TYPE_CHECKING:
    from gspo_rl.redisq.ready.reader import Batch

log = logging.getLogger(__name__)


def staleness_histogram(staleness: Iterable[int]) -> dict[str, int]:
    """Counts per staleness value, keys as strings (JSON object keys), sorted."""
    c = Counter(int(s) for s in staleness)
    return {str(k): c[k] for k in sorted(c)}


def reward_stats(groups: Sequence[ReadyGroup]) -> dict[str, float]:
    rewards = [float(r) for g in groups for r in g.rewards]
    if not rewards:
        return {}
    mean = sum(rewards) / len(rewards)
    var = sum((r - mean) ** 2 for r in rewards) / len(rewards)
    return {"reward_mean": mean, "reward_std": math.sqrt(var),
            "reward_max": max(rewards), "reward_min": min(rewards)}


def source_stats(groups: Sequence[ReadyGroup], key: str = "source") -> dict[str, float]:
    """Per value of the group metadata's ``key``: ``source`` (the task source, set by tasks
    from data and reasoning-gym), ``env`` (the environment of a mix, ``gspo up --env`` more
    than once) or ``difficulty`` (the band its task was drawn in, ``gspo_rl.client.selection``):
    the mean reward of its trained groups and how many there were, as flat
    ``<key>/<name>/...``."""
    by: dict[str, list[float]] = {}
    counts: Counter[str] = Counter()
    for g in groups:
        name = g.metadata.get(key) if isinstance(g.metadata, dict) else None
        if isinstance(name, str) and name:
            by.setdefault(name, []).extend(float(r) for r in g.rewards)
            counts[name] += 1
    out: dict[str, float] = {}
    for name, rewards in sorted(by.items()):
        out[f"{key}/{name}/reward_mean"] = sum(rewards) / max(1, len(rewards))
        out[f"{key}/{name}/groups"] = float(counts[name])
    return out


def eval_record(entry_id: str, result: dict[str, Any], run_id: str,
                step: int) -> dict[str, Any]:
    """An evaluation result (``gspo_rl.redisq.evals``) as a metrics record: flat
    ``eval/<name>/<metric>`` numbers, the policy version it evaluated, the learner's step."""
    name = str(result.get("name", "eval"))
    metrics = result.get("metrics") or {}
    rec: dict[str, Any] = {"event": "eval", "run_id": run_id, "step": step,
                           "version": int(result.get("policy_version", -1)), "name": name,
                           "eval_id": entry_id, "time": float(result.get("time", 0.0))}
    rec.update({f"eval/{name}/{k}": float(v) for k, v in metrics.items()
                if isinstance(v, int | float) and not isinstance(v, bool)})
    return rec


def eval_line(rec: dict[str, Any]) -> str:
    """One terminal line for an evaluation record."""
    prefix = f"eval/{rec['name']}/"
    parts = [f"{k.removeprefix(prefix)} {_fmt(v)}" for k, v in rec.items()
             if k.startswith(prefix) and "/" not in k.removeprefix(prefix)]
    return f"eval {rec['name']} v{rec['version']} (step {rec['step']}) | " + " | ".join(parts)


def read_counters(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """The queue's counters hash (groups created, dropped by reason, tokens generated, ...)."""
    return {as_str(k): int(float(v)) for k, v in client.hgetall(keys.counters).items()}


def drop_counts(counters: dict[str, int]) -> dict[str, int]:
    """Totals of groups lost to training, by reason: every counter whose name says
    ``dropped`` or ``lost`` (``groups_dropped_stale``, ``groups_dropped_<reason>``,
    ``groups_expired_dropped``, ...), ``groups_`` stripped."""
    return dict(sorted((k.removeprefix("groups_"), v) for k, v in counters.items()
                       if "dropped" in k or "lost" in k))


def read_drop_counters(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """``drop_counts`` of the counters in Redis."""
    return drop_counts(read_counters(client, keys))


def waste_fields(counters: dict[str, int], groups_trained: int,
                 tokens_trained: int) -> dict[str, float]:
    """What became of the generated work, since the queue began: groups and sampled tokens
    generated (by every server), trained (by the learner), and the trained share of each
    (``trained_group_fraction``, ``trained_token_fraction``; 1.0 before anything was
    generated). The rest went to groups dropped (equal rewards, stale, expired) or in flight."""
    groups, tokens = counters.get("groups_created", 0), counters.get("tokens_generated", 0)
    return {"groups_generated_total": groups, "tokens_generated_total": tokens,
            "tokens_trained_total": tokens_trained,
            "trained_group_fraction": groups_trained / groups if groups else 1.0,
            "trained_token_fraction": tokens_trained / tokens if tokens else 1.0}


def trained_fractions(trained: int, dropped: dict[str, int]) -> dict[str, float]:
    """Of the groups that finished (trained, or dropped for any reason), the fraction trained;
    and the same leaving out equal-reward groups (``dropped.zero_variance``: no learning
    signal, so no admission rule could make them trainable). 1.0 before anything finished."""
    lost = sum(dropped.values())
    no_signal = dropped.get("dropped_zero_variance", 0)
    finished, with_signal = trained + lost, trained + lost - no_signal
    return {"trained_fraction": trained / finished if finished else 1.0,
            "trained_fraction_with_signal": trained / with_signal if with_signal else 1.0}


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1e4 else f"{x:.0f}"


def group_fates(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """The fate of every group, from Redis: ``generated`` (groups created), ``trained`` (by
    the learner, as it published), ``dropped_<reason>`` (stale, zero_variance, ...),
    ``expired_dropped``, and ``in_flight`` (generated, not yet trained or dropped); and the
    sampled tokens ``tokens_generated`` (by every server) and ``tokens_trained``."""
    raw = read_counters(client, keys)
    state = client.hmget(keys.learner_state, "groups_trained", "tokens_trained")
    trained = int(float(state[0] or 0))
    out = {"generated": raw.get("groups_created", 0), "trained": trained,
           "tokens_generated": raw.get("tokens_generated", 0),
           "tokens_trained": int(float(state[1] or 0))}
    out.update({k.removeprefix("groups_"): v for k, v in sorted(raw.items())
                if "dropped" in k})
    out["in_flight"] = max(0, out["generated"] - trained - sum(
        v for k, v in out.items() if "dropped" in k))
    return out


def fates_line(c: dict[str, int]) -> str:
    """One line: how many generated groups were trained, and where the others went."""
    gen, trained = c.get("generated", 0), c.get("trained", 0)
    finished = max(1, gen - c.get("in_flight", 0))
    equal = c.get("dropped_zero_variance", 0)
    others = ", ".join(f"{k} {v}" for k, v in c.items()
                       if "dropped" in k and k != "dropped_zero_variance")
    return (f"groups: {gen} generated, {trained} trained ({trained / max(1, gen):.0%} of "
            f"those generated, {trained / finished:.0%} of the {finished} finished; "
            f"{trained / max(1, finished - equal):.0%} of those with a learning signal), "
            f"{equal} equal-reward dropped" + (f", {others}" if others else "")
            + f", {c.get('in_flight', 0)} in flight; sampled tokens: "
            f"{c.get('tokens_generated', 0)} generated, {c.get('tokens_trained', 0)} trained "
            f"({c.get('tokens_trained', 0) / max(1, c.get('tokens_generated', 0)):.0%})")


def console_line(rec: dict[str, Any]) -> str:
    """One compact line per step for the terminal."""
    g = rec.get
    parts = [f"step {rec['step']} v{rec['version']}",
             f"groups {g('groups', 0)}",
             f"reward trained {_fmt(g('reward_mean', float('nan')))}"
             + ("" if g("env_reward") is None else f" sampled {_fmt(rec['env_reward'])}"),
             f"loss {_fmt(g('loss', float('nan')))}",
             f"clip {_fmt(g('clip_fraction', 0.0))} (lo {_fmt(g('clip_low_fraction', 0.0))} "
             f"hi {_fmt(g('clip_high_fraction', 0.0))})",
             f"|log s| {_fmt(g('abs_log_ratio_mean', 0.0))}",
             f"gnorm {_fmt(g('grad_norm', 0.0))}",
             f"tok/s {_fmt(g('tokens_per_s', 0.0))}",
             f"stale {g('staleness', {})}",
             f"dropped {sum((g('dropped') or {}).values())} "
             f"(trained {g('trained_fraction', 1.0):.0%} of finished groups, "
             f"{g('trained_fraction_with_signal', 1.0):.0%} of those with signal)",
             f"trained {g('trained_group_fraction', 1.0):.0%} of generated groups, "
             f"{g('trained_token_fraction', 1.0):.0%} of generated tokens",
             f"wait {g('time_wait_s', 0.0):.2f}s compute {g('time_compute_s', 0.0):.2f}s "
             f"sync {g('time_sync_s', 0.0):.2f}s"
             + ("" if g("sync_ok", True) else " NOT SYNCED: servers run older weights")]
    return " | ".join(parts)


class MetricsLogger:
    """Writes each record to the enabled sinks: the JSONL, the terminal (step records) and
    the trackers (``tracker``, closed with the logger). Never raises on a sink failure after
    construction: metrics must not stop training (failures are logged once)."""

    def __init__(self, jsonl_path: Path | None = None, console: bool = True,
                 tracker: Tracker | None = None, first_step: int = 0) -> None:
        self.jsonl_path = jsonl_path
        self._jsonl = None
        if jsonl_path is not None:
            jsonl_path.parent.mkdir(parents=True, exist_ok=True)
            torn = _ends_mid_line(jsonl_path)
            self._jsonl = open(jsonl_path, "a", encoding="utf-8")  # noqa: SIM115 - long-lived
            if torn:  # a process killed mid-write: end its line so ours parse
                self._jsonl.write("\n")
        self._console = None
        if console:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.tracker = tracker
        self._step = first_step  # the trackers' x axis for records without a step
        self._warned = False

    def log(self, rec: dict[str, Any]) -> None:
        """A step record: the JSONL, one terminal line, the trackers."""
        try:
            self._write(rec)
            if self._console is not None:
                self._console.print(console_line(rec), markup=False)
        except (OSError, ValueError) as exc:
            self._warn(exc)
        self._track(rec)

    def log_eval(self, rec: dict[str, Any]) -> None:
        """An evaluation record (``eval_record``): the JSONL, the trackers, one terminal
        line."""
        self.event(rec)
        try:
            if self._console is not None:
                self._console.print(eval_line(rec), markup=False)
        except (OSError, ValueError) as exc:
            self._warn(exc)

    def event(self, rec: dict[str, Any]) -> None:
        """A non-step record (start, stop, stall, checkpoint, evaluation): the JSONL and the
        trackers."""
        try:
            self._write(rec)
        except (OSError, ValueError) as exc:
            self._warn(exc)
        self._track(rec)

    def _write(self, rec: dict[str, Any]) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(rec, default=float) + "\n")
            self._jsonl.flush()

    def _track(self, rec: dict[str, Any]) -> None:
        if self.tracker is None:
            return
        step = rec.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            self._step = step
        self.tracker.log(rec, self._step)

    def _warn(self, exc: Exception) -> None:
        if not self._warned:
            log.warning("metrics sink failed: %s", exc)
            self._warned = True

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None


def log_new_evals(client: redis.Redis, keys: Keys, logger: MetricsLogger, run_id: str,
                  step: int) -> int:
    """Logs the evaluation results no learner has logged yet (``gspo_rl.redisq.evals``)
    and moves the cursor past each; returns how many. Raises on Redis errors (the next call
    logs them)."""
    entries = read_unlogged(client, keys)
    for entry_id, result in entries:
        logger.log_eval(eval_record(entry_id, result, run_id, step))
        mark_logged(client, keys, entry_id)
    return len(entries)


def _ends_mid_line(path: Path) -> bool:
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def trained_history(jsonl_path: Path) -> list[dict[str, Any]]:
    """The step records of the surviving model's history.

    Each run writes a ``start`` record with ``resumed_from`` (the checkpoint step it loaded,
    0 for a fresh start). Steps logged by an earlier run after that step died with its process
    (their updates were never checkpointed), so they are cut when the next run starts. A line
    torn by a killed process is skipped (its step, if any, was never checkpointed either: a
    step record is written before the checkpoint that covers it).
    """
    history: list[dict[str, Any]] = []
    with open(jsonl_path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("event") == "start":
                keep = int(rec.get("resumed_from", 0))
                history = [h for h in history if h["step"] <= keep]
            elif "step" in rec and rec.get("event", "step") == "step":
                history.append(rec)
    return history


def step_fields(batch: Batch, metrics: dict[str, float], times: dict[str, float | None],
                counters: dict[str, int], groups_trained: int, invalid: int,
                tokens_trained: int = 0) -> dict[str, Any]:
    """The fields of a step's record that describe its batch and the run's group fates:
    ``reward_mean`` and ``reward_trained`` (its groups': they have a learning signal by
    construction) apart from ``reward_sampled`` (every sampled group's, ``env_reward``), and
    the waste (``waste_fields``)."""
    dropped = drop_counts(counters)
    rewards = reward_stats(batch.groups)
    return {
        "groups": len(batch.groups), **rewards,
        "reward_trained": rewards.get("reward_mean", float("nan")),
        "reward_sampled": times.get("env_reward"),
        **waste_fields(counters, groups_trained, tokens_trained),
        **source_stats(batch.groups), **source_stats(batch.groups, "env"),
        **source_stats(batch.groups, "difficulty"), **metrics,
        "time_compute_s": metrics["compute_s"], **times,
        "staleness": staleness_histogram(batch.staleness),
        "dropped": dropped, "dropped_stale_step": batch.dropped_stale,
        "groups_trained_total": groups_trained,
        **trained_fractions(groups_trained, dropped),
        "dropped_invalid_step": invalid, "reclaimed": batch.reclaimed,
        "group_ids": [g.group_id for g in batch.groups], "entry_ids": batch.entry_ids,
    }
