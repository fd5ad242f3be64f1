"""The dashboard's screenshot in the docs, taken of a live run (docs/figures/dashboard.png).

Starts ``gspo up`` (the demo, in a temporary run directory), waits until its learner has
taken ``--steps`` steps, opens the address ``gspo up`` printed in Debian's headless Chromium
(``scripts/setup.sh`` with ``GSPO_BROWSER=1``), lets it watch ``--watch-s`` seconds, opens the
newest trained group in the rollout browser shaded by ``--shade``, saves the page, then stops
the run with Ctrl-C. Every wait is bounded and says what
it waited for when it gives up.

    .venv/bin/python scripts/dashboard_screenshot.py --out docs/figures/dashboard.png
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def start_up(run_dir: Path, minutes: float) -> tuple[subprocess.Popen[str], list[str]]:
    """``gspo up`` on the demo; its output lines collect in the returned list."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gspo_rl.cli", "up", "--run-dir", str(run_dir),
         "--target-reward", "0", "--minutes", str(minutes)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True).start()
    return proc, lines


def wait_for(what: str, cond: object, timeout_s: float, lines: list[str]) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()  # type: ignore[operator]
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"gave up waiting for {what} after {timeout_s:g} s; gspo up said:\n"
                     + "".join(lines[-40:]))


def steps_taken(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines()
               if line.strip() and json.loads(line).get("event", "step") == "step")


def shoot(url: str, out: Path, width: int, height: int, shade: str, watch_s: float) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from tests.helpers.browser import chromium

    with chromium(width, height) as driver:
        driver.get(url)
        wait = WebDriverWait(driver, 60)
        wait.until(lambda d: d.find_element(By.ID, "conn").text == "live")
        time.sleep(watch_s)  # the pace and the rates need some seconds of watching
        # a trained group (its tokens have importance ratios: acknowledged, else the oldest
        # read by the learner, acknowledged at its next checkpoint); in the page's own
        # script, as the list is redrawn every second
        pills = wait.until(lambda d: d.execute_script(
            "const rows = [...document.querySelectorAll('#group-list [data-group]')];"
            "const r = rows.find((b) => b.textContent.includes('acked')) ||"
            "  rows.reverse().find((b) => b.textContent.includes('in a step'));"
            "if (r) { r.click(); return 'trained'; }"
            "return rows.length ? rows.map((b) => b.querySelector('.pill').textContent)"
            ".join(',') : '';"))
        if pills != "trained":
            raise SystemExit(f"no trained group in the rollout browser's list: {pills}")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#group-detail .tok"))
        Select(driver.find_element(By.ID, "shade")).select_by_value(shade)
        time.sleep(2)  # one more refresh of the cards
        height_px = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(width, min(int(height_px) + 40, 2400))
        time.sleep(1)
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs/figures/dashboard.png")
    ap.add_argument("--steps", type=int, default=6, help="learner steps before the shot")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=900)
    ap.add_argument("--shade", default="ratio",
                    choices=["logprob", "ratio", "advantage", "version"])
    ap.add_argument("--watch-s", type=float, default=12.0,
                    help="seconds the page watches before the shot (its rates)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gspo-shot-") as tmp:
        run_dir = Path(tmp) / "run"
        proc, lines = start_up(run_dir, minutes=10)
        try:
            found = wait_for("gspo up to print the dashboard's address",
                             lambda: next((m for m in (re.search(r"dashboard: (\S+)", x)
                                                       for x in lines) if m), None), 300, lines)
            url = found.group(1)  # type: ignore[attr-defined]
            wait_for(f"{args.steps} learner steps",
                     lambda: steps_taken(run_dir) >= args.steps, 600, lines)
            shoot(url, args.out, args.width, args.height, args.shade, args.watch_s)
            print(f"saved {args.out} at learner step {steps_taken(run_dir)}")
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
