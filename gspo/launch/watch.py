"""``gspo up`` following its learner: the progress from its metrics stream, a child's crash, its
exit, and its wait for the final evaluation (a ``final_eval_wait`` record: the learner has
trained and waits to log the evaluation of its final weights,
``gspo_rl.learner.runtime.final_eval``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from gspo_rl.launch.processes import Processes
from gspo_rl.launch.runlog import JsonlTail, step_records

# gspo_rl.learner.runtime.final_eval.WAIT_EVENT (not imported: it imports redis)
WAIT_EVENT = "final_eval_wait"


async def watch_learner(minutes: float, runner: asyncio.Task[Any], procs: Processes,
                        tail: JsonlTail, steps: deque[dict[str, Any]], show: Any) -> int | None:
    """Every 0.5 s: surface an environment error or a child's crash, show the progress; return
    once the learner exits (0: done: None), waits for the final evaluation (the version it
    waits for: the weights it trained last) or ``minutes`` have passed (None)."""
    deadline = time.monotonic() + minutes * 60
    while True:
        await asyncio.sleep(0.5)
        if runner.done():
            runner.result()  # an environment error ends the run, loudly
        procs.check("server")
        records = tail.new_records()
        steps.extend(step_records(records))
        show()
        for r in records:
            if r.get("event") == WAIT_EVENT:
                return int(r.get("version", 0))
        code = procs.exit_code("learner")
        if code is not None:
            if code != 0:
                procs.check("learner")
            return None
        if time.monotonic() > deadline:
            return None


async def until_exit(procs: Processes, name: str, timeout_s: float) -> None:
    """Until ``name`` exits, at most ``timeout_s`` (then whoever stops the processes stops
    it)."""
    deadline = time.monotonic() + timeout_s
    while procs.exit_code(name) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
