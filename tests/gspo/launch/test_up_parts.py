"""``gspo up``'s parts that need no run: its settings (``--config`` below the flags, one-line
errors), the progress line at 80 columns, and the order in which it stops its processes
(the learner's last acknowledgement before Redis stops)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from rich.console import Console
from typer.testing import CliRunner

from gspo_rl.cli import app
from gspo_rl.launch.display import figures, make_progress, show, status_text
from gspo_rl.launch.processes import Processes
from gspo_rl.launch.up import UpConfig

DEFAULTS = {"run_dir": "runs/up", "target_reward": 0.8}


def test_config_file_below_flags_and_defaults_below_both(tmp_path: Path) -> None:
    path = tmp_path / "up.toml"
    path.write_text('lr = 5e-4\nloss = "gspo_token"\nmax_steps = 20\ntarget_reward = 0.9\n')
    cfg = UpConfig.from_toml(path, defaults=DEFAULTS, max_steps=30, loss=None)
    assert (cfg.lr, cfg.loss, cfg.max_steps, cfg.target_reward) == (5e-4, "gspo_token", 30, 0.9)
    assert cfg.run_dir == Path("runs/up")
    assert UpConfig.from_toml(path, defaults=DEFAULTS, target_reward=0).target_reward is None
    path.write_text("learning_rate = 1e-3\n")
    with pytest.raises(ValidationError, match="learning_rate"):
        UpConfig.from_toml(path, defaults=DEFAULTS)


@pytest.mark.parametrize(("args", "words"), [
    (["--loss", "ppo"], "loss"),
    (["--config", "nowhere.toml"], "nowhere.toml"),
    (["--lr", "-1"], "lr"),
])
def test_bad_settings_are_refused_in_a_few_lines(args: list[str], words: str) -> None:
    r = CliRunner().invoke(app, ["up", *args])
    assert r.exit_code == 2, r.output
    assert "invalid settings" in r.output and words in r.output
    assert "Traceback" not in r.output and len(r.output.splitlines()) <= 3


def test_the_progress_line_fits_80_columns() -> None:
    worst = {"step": 300, "reward": 0.123, "env_reward": 0.456, "tok_s": 123456.0,
             "staleness": 1.25, "trained_fraction": 0.97, "token_fraction": 0.35}
    out = io.StringIO()
    progress, task = make_progress(300, Console(file=out, width=80, force_terminal=True,
                                                color_system=None))
    show(progress, task, worst, "  eval v12 0.45")
    progress.console.print(progress.get_renderable())
    lines = [line.rstrip() for line in out.getvalue().splitlines() if line.strip()]
    assert lines and max(len(line) for line in lines) <= 80
    text = lines[-1]
    assert "300/300" in text and "reward 0.46 (trained 0.12)" in text
    assert "trained 97% grp 35% tok" in text
    assert status_text(figures(worst, "  eval v12 0.45"), 200).endswith("123456 tok/s")


CHILD = """
import signal, sys, time
name, log = sys.argv[1], sys.argv[2]
def stop(*_):
    open(log, "a").write(name + " asked\\n")
    time.sleep(0.3)
    open(log, "a").write(name + " gone\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(log, "a").write(name + " up\\n")
while True:
    time.sleep(0.05)
"""


def test_processes_stop_newest_first_one_at_a_time(tmp_path: Path) -> None:
    log = tmp_path / "order.log"
    procs = Processes(tmp_path)
    for name in ("redis", "server", "learner"):
        procs.start(name, [sys.executable, "-c", CHILD, name, str(log)])
        while f"{name} up" not in (log.read_text() if log.exists() else ""):
            pass
    procs.stop_all()
    order = log.read_text().splitlines()[3:]
    assert order == ["learner asked", "learner gone", "server asked", "server gone",
                     "redis asked", "redis gone"]


def test_an_environment_name_becomes_a_valid_eval_set_name() -> None:
    """POST /v1/evals takes letters, digits and ``_.-/@``: reasoning-gym's ``a+b`` and an
    OpenEnv ``host:port`` are made valid (a gspo up run's final evaluation was refused)."""
    from gspo_rl.launch.workload import eval_name

    assert eval_name("leg_counting+basic_arithmetic") == "leg_counting_basic_arithmetic"
    assert eval_name("127.0.0.1:8001") == "127.0.0.1_8001" and eval_name("") == "eval"
