"""The records of a `gspo up` run: reading them, their curves, their plot, their summary.

A run directory holds ``metrics.jsonl`` (the learner: one ``"event": "step"`` record per step,
plus start/stop events) and ``env_rewards.jsonl`` (the environment: one record per finished
group with its mean reward and the policy version that sampled it). Pure functions of those
records, shared by ``gspo up`` and the benchmarks that drive it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

ENV_WINDOW = 32  # groups in the environment-side moving average


class JsonlTail:
    """Reads the records appended to a JSONL file since the last call (a partial last line
    waits for the next call), so a progress loop never re-reads the whole file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        return _parse(data[:end].decode(errors="replace"))


def _parse(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every record of a JSONL file (none if it does not exist yet)."""
    return _parse(path.read_text()) if path.exists() else []


def step_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The learner's per-step records (start/stop events left out)."""
    return [r for r in records if r.get("event", "step") == "step"]


def moving(xs: list[float], window: int) -> list[float]:
    """Trailing moving average (shorter windows at the start)."""
    out = []
    for i in range(len(xs)):
        part = xs[max(0, i - window + 1):i + 1]
        out.append(sum(part) / len(part))
    return out


def version_curve(env_records: list[dict[str, Any]]) -> list[tuple[int, float, int]]:
    """Mean reward of every group the environment finished, by the policy version that
    sampled it. Unlike the learner's reward (groups it trained on), this includes the groups
    dropped for equal rewards, which become common as the policy gets good."""
    by_version: dict[int, list[float]] = {}
    for r in env_records:
        by_version.setdefault(int(r["version"]), []).append(float(r["reward"]))
    return [(v, sum(x) / len(x), len(x)) for v, x in sorted(by_version.items()) if v >= 0]


def plot_rewards(records: list[dict[str, Any]], sampled: list[tuple[int, float, int]],
                 path: Path, title: str) -> Path | None:
    """Two curves against the policy version: the reward of every sampled group (what the
    policy earns) and the learner's reward (the groups it trained on). Saved as a PNG."""
    points = [(r["step"], r["reward_mean"]) for r in records if "reward_mean" in r]
    if not points and not sampled:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if sampled:
        versions, means, counts = zip(*sampled, strict=True)
        smooth = moving(list(means), max(1, len(means) // 10))
        ax.plot(versions, means, alpha=0.3, color="C0",
                label="sampled groups, the mean of each version")
        ax.plot(versions, smooth, color="C0",
                label=f"sampled groups, moving average ({sum(counts)} groups)")
    if points:
        steps, rewards = zip(*points, strict=True)
        ax.plot(steps, moving(list(rewards), max(1, len(rewards) // 10)), color="C1",
                label="trained groups (equal-reward groups excluded)")
    ax.set_xlabel("policy version (learner step)")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def summarize(records: list[dict[str, Any]], threshold: float = 0.8, window: int = 5,
              env_records: list[dict[str, Any]] | None = None) -> dict[str, float]:
    """Figures of one run from its learner step records (and the environment's groups).

    ``tokens_per_s``: tokens trained per second of wall time, first step to last.
    ``time_to_threshold_s``: wall seconds from the first step until the ``window``-step moving
    average of the learner's reward first reaches ``threshold`` (NaN if it never does).
    ``final_reward``: that moving average over the last ``window`` steps.
    With ``env_records`` (``env_rewards.jsonl``), the same for every sampled group over a
    moving window of ``ENV_WINDOW`` groups: ``sampled_time_to_threshold_s`` (from the first
    group) and ``sampled_final_reward``.
    """
    steps = [r for r in step_records(records) if "reward_mean" in r]
    out: dict[str, float] = {"steps": float(len(steps))}
    if env_records:
        rewards = [float(r["reward"]) for r in env_records]
        env_avg = moving(rewards, ENV_WINDOW)
        t0 = env_records[0]["time"]
        out["sampled_final_reward"] = env_avg[-1]
        out["sampled_time_to_threshold_s"] = next(
            (env_records[i]["time"] - t0 for i, m in enumerate(env_avg)
             if i + 1 >= ENV_WINDOW and m >= threshold), float("nan"))
    if len(steps) < 2:
        return out
    t0, t1 = steps[0]["time"], steps[-1]["time"]
    step_avg = moving([float(r["reward_mean"]) for r in steps], window)
    stale = [(int(k), v) for r in steps for k, v in (r.get("staleness") or {}).items()]
    n_stale = sum(v for _, v in stale)
    out.update({
        "tokens_per_s": sum(float(r.get("tokens", 0)) for r in steps[1:]) / max(t1 - t0, 1e-9),
        "time_to_threshold_s": next((steps[i]["time"] - t0 for i, m in enumerate(step_avg)
                                     if m >= threshold), float("nan")),
        "final_reward": step_avg[-1],
        "staleness_mean": sum(k * v for k, v in stale) / n_stale if n_stale else 0.0,
        "clip_fraction_mean": sum(float(r.get("clip_fraction", 0.0)) for r in steps) / len(steps),
        "dropped_stale": float((steps[-1].get("dropped") or {}).get("dropped_stale", 0)),
    })
    return out
