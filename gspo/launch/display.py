"""``gspo up``'s progress bar: one line that fits the terminal (80 columns included), so that
nothing is cut off. The bar and ``step/total`` and the elapsed time always show; the figures
(the reward of every sampled group, then of the trained ones; the share of the generated groups
and sampled tokens the learner trained on; the latest evaluation; staleness; tokens/s) come in
that order of importance, as many as fit.
"""

from __future__ import annotations

from typing import Any

BAR_WIDTH = 10
# the bar, " 300/300 " and " 0:00:00" around the figures, and a column to spare
FIXED_WIDTH = BAR_WIDTH + 9 + 8 + 1


def figures(s: dict[str, Any], eval_status: str = "") -> list[str]:
    """The progress figures of one status (``gspo_rl.launch.up._status``), most important
    first."""
    if s.get("final_eval"):
        return ["training done: final evaluation", eval_status.strip()]
    return [f"reward {s['env_reward']:.2f} (trained {s['reward']:.2f})",
            f"trained {s['trained_fraction']:.0%} grp {s['token_fraction']:.0%} tok",
            eval_status.strip(), f"stale {s['staleness']:.2f}", f"{s['tok_s']:.0f} tok/s"]


def status_text(parts: list[str], width: int) -> str:
    """As many of ``parts`` (in order, empty ones skipped) as fit in ``width`` columns."""
    out = ""
    for part in (p for p in parts if p):
        joined = f"{out}  {part}" if out else part
        if len(joined) > width:
            break
        out = joined
    return out


def make_progress(total: int, console: Any = None) -> tuple[Any, Any]:
    """A ``rich`` Progress of ``total`` steps (on ``console``; None: the terminal) and its
    task id."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(BarColumn(bar_width=BAR_WIDTH),
                        TextColumn("{task.completed:.0f}/{task.total:.0f}"),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                        refresh_per_second=4, console=console)
    return progress, progress.add_task("training", total=total, info="starting")


def show(progress: Any, task: Any, s: dict[str, Any], eval_status: str = "") -> None:
    """Update the bar with status ``s``, its figures fitted to the console's width."""
    width = max(20, progress.console.width - FIXED_WIDTH)
    progress.update(task, completed=s["step"],
                    info=status_text(figures(s, eval_status), width))
