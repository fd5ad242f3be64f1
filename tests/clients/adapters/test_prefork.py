"""The fork server that starts verifiers' harness programs (``adapters.verifiers.prefork``),
as a program sees it: its argv, environment, working directory, standard streams and exit
status are those it was started with; a signal to the client reaches it; killing the client
(what verifiers' runtime does to a process group) ends it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from gspo_rl.client.adapters.verifiers.prefork import launcher
from tests.conftest import wait_until

PROGRAM = """
import os, sys, time
print("argv", sys.argv[1:], flush=True)
print("cwd", os.getcwd(), flush=True)
print("env", os.environ.get("GSPO_PREFORK_TEST"), flush=True)
print("name", __name__, flush=True)
line = sys.stdin.readline().strip()
if line == "sleep":
    open(sys.argv[1], "w").write(str(os.getpid()))
    time.sleep(60)
print("stdin", line, flush=True)
print("to stderr", file=sys.stderr, flush=True)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""


@pytest.fixture(scope="module")
def prefix() -> list[str]:
    return launcher(["json"])


@pytest.fixture
def program(tmp_path: Path) -> Path:
    p = tmp_path / "program.py"
    p.write_text(PROGRAM)
    return p


def test_a_program_runs_as_itself(prefix: list[str], program: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run([*prefix, str(program), "x", "3"], input=b"hello\n", capture_output=True,
                       cwd=work, env={**os.environ, "GSPO_PREFORK_TEST": "yes"}, timeout=30)
    out = r.stdout.decode().splitlines()
    assert r.returncode == 3
    assert out == ["argv ['x', '3']", f"cwd {work}", "env yes", "name __main__", "stdin hello"]
    assert r.stderr.decode().strip() == "to stderr"


def test_an_error_is_the_programs_own(prefix: list[str], tmp_path: Path) -> None:
    p = tmp_path / "bad.py"
    p.write_text("raise ValueError('broken program')\n")
    r = subprocess.run([*prefix, str(p)], capture_output=True, timeout=30)
    assert r.returncode == 1 and b"ValueError: broken program" in r.stderr


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_client_stops_the_program(prefix: list[str], program: Path,
                                               tmp_path: Path, how: signal.Signals) -> None:
    pid_file = tmp_path / f"pid-{how.name}"
    client = subprocess.Popen([*prefix, str(program), str(pid_file)], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, start_new_session=True)
    assert client.stdin is not None
    client.stdin.write(b"sleep\n")
    client.stdin.flush()
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), "the program started")
    child = int(pid_file.read_text())
    os.killpg(client.pid, how)  # as verifiers' runtime ends a program
    client.wait(timeout=30)
    wait_until(lambda: not _alive(child), "the program ended with its client", timeout=10)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead: its parent (the fork server) has not reaped it yet
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
