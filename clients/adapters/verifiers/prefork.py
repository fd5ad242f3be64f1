"""A fork server for verifiers' harness programs: start each in milliseconds, not seconds.

verifiers runs an agent's harness as a program of its own, started again for every segment
of an episode (a multi-turn game relaunches it each turn). Its chat program imports openai,
mcp and httpx first: about 1.3 s of CPU per start on this machine, more than the rest of a
tiny model's turn. The fork server imports a program's dependencies once and forks a child
per start; the child runs the program as ``__main__`` with the caller's argv, environment,
working directory and standard streams, so the program sees what a fresh interpreter would.

- ``launcher(modules)`` starts (once per module set) a server process that imports
  ``modules`` and listens on a Unix socket; it returns the argv prefix that starts a program
  through it: ``[python, -S, this file, SOCKET]``, then the script and its arguments.
- The client (this file run as a script, without ``site``: ~20 ms) sends its argv,
  environment, working directory and its standard streams' file descriptors, then waits for
  the child's exit status and exits with it. A SIGTERM or SIGINT to the client is passed to
  the child; a client that dies (SIGKILL) closes its socket, and the server kills the child:
  killing the client's process group (what verifiers' runtime does) ends the program.
- The server exits when the process that started it does.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

READY_TIMEOUT_S = 60.0
_SERVERS: dict[tuple[str, ...], tuple[subprocess.Popen[bytes], str]] = {}
_WAKE: list[int] = []  # the server's self-pipe (a child closes it)


def launcher(modules: list[str], warm: str | None = None) -> list[str]:
    """The argv prefix that starts a script through a fork server that preloaded ``modules``
    and ran the script ``warm`` once under another name than ``__main__`` (its definitions
    and imports, not its main: so every import it makes is done); started on first use,
    RuntimeError if it does not come up."""
    key = (*sorted(modules), *([f"@{warm}"] if warm else []))
    known = _SERVERS.get(key)
    if known is None or known[0].poll() is not None:
        path = os.path.join(tempfile.mkdtemp(prefix="gspo-prefork-"), "socket")
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", path, str(os.getpid()), *key],
            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not os.path.exists(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the harness fork server did not start (preloading "
                                   f"{', '.join(key)}; exit {proc.poll()})")
            time.sleep(0.02)
        _SERVERS[key] = known = (proc, path)
    return [sys.executable, "-S", __file__, known[1]]


# ------------------------------------------------------------------ the server


def _child(request: dict[str, Any], fds: list[int], inherited: list[socket.socket]) -> None:
    """In the forked child: become the program, run it, exit with its status."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in _WAKE:
        os.close(fd)
    for s in inherited:  # the listener and the other clients' connections are not its own
        s.close()
    os.setsid()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    try:
        import runpy

        sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the program's own error: its traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing left to say
            stream.flush()
    os._exit(code)


def _start(conn: socket.socket, inherited: list[socket.socket]) -> int | None:
    """Read one start request and fork its child; None if the client went away."""
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 22, 3)
    if not msg:
        return None
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        _child(json.loads(msg), fds, inherited)
    for fd in fds:
        os.close(fd)
    return pid


def serve(path: str, parent: int, modules: list[str]) -> None:
    """Import ``modules`` (``@FILE``: run FILE once, not as ``__main__``), then fork a child per
    connection until ``parent`` exits."""
    import importlib
    import runpy

    for name in modules:
        if name.startswith("@"):
            runpy.run_path(name[1:], run_name="__gspo_prefork_warm__")
        else:
            importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # the socket appears whole: launcher() waits for it
    children: dict[socket.socket, int] = {}
    wake_r, wake_w = os.pipe()  # a child's exit (SIGCHLD) wakes the select at once
    _WAKE[:] = [wake_r, wake_w]
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    while os.getppid() == parent:
        waits: list[socket.socket | int] = [listener, wake_r, *children]
        ready, _, _ = select.select(waits, [], [], 1.0)
        for s in ready:
            if isinstance(s, int):  # wake_r (the only int)
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
            elif s is listener:
                conn, _ = listener.accept()
                pid = _start(conn, [listener, *children])
                if pid is None:
                    conn.close()
                else:
                    children[conn] = pid
            elif not s.recv(64):  # the client died: end its program
                _kill(children.pop(s))
                s.close()
            else:
                os.kill(children[s], signal.SIGTERM)  # the client passed a signal on
        _reap(children)
    for pid in children.values():
        _kill(pid)


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _reap(children: dict[socket.socket, int]) -> None:
    """Tell each client whose program ended its exit status."""
    for conn, pid in list(children.items()):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 1 << 8
        if done:
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exit": code}).encode())
            conn.close()
            del children[conn]


# ------------------------------------------------------------------ the client


def client(path: str, argv: list[str]) -> int:
    """Start ``argv`` through the server at ``path``; its exit status."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])

    def forward(signum: int, frame: object) -> None:
        conn.sendall(b"s")

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    reply = b""
    while not reply.endswith(b"}"):  # one JSON object, then the server closes
        chunk = conn.recv(4096)
        if not chunk:
            break
        reply += chunk
    return int(json.loads(reply)["exit"]) if reply.endswith(b"}") else 1


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    else:
        sys.exit(client(sys.argv[1], sys.argv[2:]))
