"""What the server's weight updates are doing, said while they wait and kept for the refusals.

``WeightUpdates.track(version, timeout_s, wait)`` runs one receive (``/admin/weights/update``
or ``update_ipc``): while it lasts it logs a WARNING every ``every_s`` past ``stall_after_s``
(how long it has waited for the learner's buckets, and its bound), and afterwards keeps how
the last update ended. ``describe()`` says, in one clause, an update under way or one that
failed and was not followed by a successful one: the admission gate appends it when it
refuses groups, so the refusal names the update that keeps this server behind the learner.
``sync_state()`` is the same update as the registry's heartbeat carries it to the dashboard
(``gspo_rl.redisq.registry.WeightSync``: version, state, start, duration, error).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from gspo_rl.redisq.registry import WeightSync

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class _Update:
    version: int
    started: float
    timeout_s: float
    ended: float | None = None
    error: str | None = None
    started_at: float = 0.0  # Unix time (``started`` is monotonic)


class WeightUpdates:
    """The current (or last) weight update of one server."""

    def __init__(self, stall_after_s: float = 5.0, every_s: float = 5.0) -> None:
        self.stall_after_s, self.every_s = stall_after_s, every_s
        self.last: _Update | None = None

    async def track(self, version: int, timeout_s: float, wait: Awaitable[T]) -> T:
        """Await ``wait`` (the receive), warning while it lasts; records how it ended."""
        update = self.last = _Update(version, time.monotonic(), timeout_s,
                                     started_at=time.time())
        warner = asyncio.create_task(self._warn_while(update))
        try:
            out = await wait
        except BaseException as exc:
            update.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise
        finally:
            update.ended = time.monotonic()
            warner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await warner
        return out

    async def _warn_while(self, update: _Update) -> None:
        await asyncio.sleep(self.stall_after_s)
        while True:
            log.warning("weight update to version %d: waiting for the learner's weights for "
                        "%.0f s (gives up after %g s)", update.version,
                        time.monotonic() - update.started, update.timeout_s)
            await asyncio.sleep(self.every_s)

    def describe(self) -> str:
        """One clause on an update under way or failed last; "" when the last one loaded."""
        u = self.last
        if u is None:
            return ""
        now = time.monotonic()
        if u.ended is None:
            return (f"a weight update to version {u.version} has been receiving for "
                    f"{now - u.started:.0f} s (gives up after {u.timeout_s:g} s)")
        if u.error is not None:
            return (f"the weight update to version {u.version} failed {now - u.ended:.0f} s "
                    f"ago ({u.error}); the learner retries it")
        return ""

    def sync_state(self) -> WeightSync | None:
        """The current or last update (None: none since the server started)."""
        u = self.last
        if u is None:
            return None
        if u.ended is None:
            return WeightSync(version=u.version, state="receiving", started_at=u.started_at)
        return WeightSync(version=u.version, state="failed" if u.error else "loaded",
                          started_at=u.started_at, duration_s=round(u.ended - u.started, 3),
                          error=None if u.error is None else u.error[:200])
