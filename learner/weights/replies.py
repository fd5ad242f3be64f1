"""The servers' HTTP replies during a weight push, read as they arrive.

A push posts one control message per server (join the group, load the broadcast) and then
waits on a collective that the servers take part in. ``Replies`` watches those posts while the
collective runs: a server that answers with a failure (a 504 after its own receive timed out,
a refusal) ends the wait at once (``PushFailed``) instead of after the collective's timeout, and
a wait that outlasts ``stall_after_s`` is reported through ``on_stall`` every ``every_s`` while
it lasts, naming the servers not yet answered. ``collect`` waits for every reply the same way.
Why: docs/design/weight-sync.md#when-the-other-side-fails.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TypeVar

import httpx

from gspo_rl.redisq.registry import ServerInfo

log = logging.getLogger(__name__)
T = TypeVar("T")
StallFn = Callable[[str], None]
STALL_AFTER_S = 5.0
EVERY_S = 5.0


class PushFailed(RuntimeError):
    """A server's reply says its side of the push failed: the collective is abandoned."""


def reply_error(fut: Future[httpx.Response]) -> str | None:
    """Why a finished post failed (None: it answered 200)."""
    try:
        resp = fut.result(timeout=0)
    except Exception as exc:  # noqa: BLE001 - any transport error is the server's failure
        return f"{type(exc).__name__}: {exc}"
    if resp.status_code != 200:
        return f"HTTP {resp.status_code}: {resp.text[:300]}"
    return None


class Replies:
    """The posts of one push phase (``what``: "join", "load weights") to ``servers``."""

    def __init__(self, what: str, futures: list[tuple[ServerInfo, Future[httpx.Response]]],
                 version: int, on_stall: StallFn) -> None:
        self.what, self.futures, self.version = what, futures, version
        self.on_stall = on_stall
        self.stall_after_s, self.every_s = STALL_AFTER_S, EVERY_S
        self.started = time.monotonic()
        self._last_report = -float("inf")

    def failure(self) -> str | None:
        """The first reply that has arrived and is a failure, described; None if none."""
        for s, fut in self.futures:
            if fut.done() and (err := reply_error(fut)) is not None:
                return f"server {s.server_id} ({s.url}) failed to {self.what}: {err}"
        return None

    def failed(self) -> list[str]:
        """Ids of the servers whose reply has arrived and is a failure."""
        return [s.server_id for s, fut in self.futures
                if fut.done() and reply_error(fut) is not None]

    def poll(self, activity: str) -> None:
        """While a collective runs: raise ``PushFailed`` on a failed reply, report a stall."""
        if (why := self.failure()) is not None:
            raise PushFailed(why)
        self.report(activity)

    def report(self, activity: str) -> None:
        """A stall report (``on_stall``) when due: past ``stall_after_s``, every ``every_s``."""
        now = time.monotonic()
        waited = now - self.started
        if waited < self.stall_after_s or now - self._last_report < self.every_s:
            return
        self._last_report = now
        waiting = [f"{s.server_id} ({s.url})" for s, fut in self.futures if not fut.done()]
        self.on_stall(f"weight push of version {self.version}: {activity} for {waited:.0f} s; "
                      f"no reply yet from {', '.join(waiting) or 'none'}")

    def race(self, work: Future[T], timeout_s: float, activity: str) -> T:
        """``work``'s result, unless a reply fails first (``PushFailed``) or ``timeout_s``
        passes (``TimeoutError``); the abandoned ``work`` ends on its own timeout."""
        deadline = time.monotonic() + timeout_s
        while not work.done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{activity}: not done within {timeout_s:g} s")
            wait([work], timeout=min(0.05, remaining))
            self.poll(activity)
        return work.result()

    def collect(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for every reply; True when all answered 200. Each
        failure, and each server that did not answer in time, is logged."""
        deadline = time.monotonic() + timeout_s
        pending = {fut for _, fut in self.futures}
        while pending and (remaining := deadline - time.monotonic()) > 0:
            _, pending = wait(pending, timeout=min(0.5, remaining),
                              return_when=FIRST_COMPLETED)
            self.report(f"waiting for the servers to {self.what}")
        ok = True
        silent = f"no reply within {timeout_s:g} s" if timeout_s > 0 else "no reply yet"
        for s, fut in self.futures:
            err = reply_error(fut) if fut.done() else silent
            if err is not None:
                log.warning("server %s (%s) failed to %s: %s", s.server_id, s.url, self.what,
                            err)
                ok = False
        return ok
