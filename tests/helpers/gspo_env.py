"""``gspo env`` as a user runs it (a subprocess of the CLI), read line by line as it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from tests.helpers.serving import API_KEY, Served

ROOT = Path(__file__).resolve().parents[2]


def gspo_env_says(served: Served, text: str, within_s: float = 120) -> str:
    """Runs ``gspo env`` (the demo) against ``served`` until a line of its output holds
    ``text`` (that line is returned), or fails after ``within_s`` with what it said."""
    env = {**os.environ, "GSPO_API_KEY": API_KEY, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "gspo_rl.cli", "env", "--url", served.url,
                             "--groups", "4", "--concurrency", "1"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    timer = threading.Timer(within_s, proc.kill)  # the read below ends when it is killed
    timer.start()
    try:
        for line in proc.stdout or []:
            lines.append(line)
            if text in line:
                return line
    finally:
        timer.cancel()
        proc.kill()
        proc.wait(timeout=30)
    raise AssertionError(f"gspo env never said {text!r} in {within_s} s:\n{''.join(lines)}")
