"""Small networking helpers shared by the launcher, the learner, scripts, tests and benchmarks
(no dependency on the server or the learner, so any of them may import it)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it; another process may take it before
    the caller binds, so callers that race retry). ``host=""``: free on every interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
