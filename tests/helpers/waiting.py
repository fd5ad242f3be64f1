"""Waiting, bounded, on an event loop for a condition (``tests.conftest.wait_until`` is the
blocking counterpart)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``cond`` every 5 ms until it is true; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.005)
