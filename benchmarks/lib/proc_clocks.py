"""Per-process and per-thread clocks from Linux ``/proc``, for the serving benchmarks: CPU
time, and where a thread's wall time went (on a core, waiting for a core, neither)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path


def _ticks(stat: Path) -> int:
    """utime + stime of a ``/proc/.../stat`` file, in clock ticks."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_clock(pid: int | None, thread: int | None = None) -> Callable[[], float]:
    """CPU seconds (user + system, every thread) used so far by process ``pid`` (None: this
    one), or by its thread ``thread`` alone (its id; the main thread's is ``pid``). CPU per
    token is what the server costs on top of the engine whatever else runs on the machine;
    wall-clock ratios move with other processes' load."""
    if pid is None:
        return time.process_time
    tick = os.sysconf("SC_CLK_TCK")
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    return lambda: _ticks(stat) / tick


def thread_cpu_ticks(pid: int) -> dict[int, int]:
    """CPU ticks used so far by each thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = _ticks(Path(f"/proc/{pid}/task/{tid}/stat"))
        except OSError:  # the thread ended
            continue
    return out


def busiest_since(pid: int, before: dict[int, int]) -> int:
    """The thread of ``pid`` that used the most CPU since ``before`` (``thread_cpu_ticks``):
    under load, the engine's scheduler thread."""
    after = thread_cpu_ticks(pid)
    return max(after, key=lambda tid: after[tid] - before.get(tid, 0))


def sched_clocks(pid: int, thread: int) -> dict[str, Callable[[], float]]:
    """Seconds thread ``thread`` of ``pid`` has spent on a core ("on_cpu") and runnable but
    waiting for one ("run_queue"; ``/proc/.../schedstat``). Over a phase, wall time minus both
    is time the thread slept: for an engine thread under load, waiting for the GIL."""
    path = Path(f"/proc/{pid}/task/{thread}/schedstat")

    def field(i: int) -> Callable[[], float]:
        return lambda: int(path.read_text().split()[i]) / 1e9

    return {"on_cpu": field(0), "run_queue": field(1)}
