"""A server's weight update says while it waits that it waits, and afterwards how it ended
(``gspo_rl.server.engines.updates``): the admission gate's refusals quote ``describe``."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gspo_rl.server.engines.updates import WeightUpdates


def test_an_update_under_way_warns_and_a_failed_one_is_described(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="gspo_rl.server.engines.updates")
    updates = WeightUpdates(stall_after_s=0.05, every_s=0.05)
    assert updates.describe() == ""

    async def go() -> None:
        release = asyncio.Event()

        async def receive() -> int:
            await release.wait()
            raise RuntimeError("Operation timed out!")

        task = asyncio.ensure_future(updates.track(3, 60.0, receive()))
        await asyncio.sleep(0.3)
        assert "weight update to version 3 has been receiving for" in updates.describe()
        release.set()
        with pytest.raises(RuntimeError):
            await task
        assert "weight update to version 3 failed" in updates.describe()
        assert "Operation timed out!" in updates.describe()

        async def loads() -> str:
            return "loaded"

        assert await updates.track(4, 60.0, loads()) == "loaded"
        assert updates.describe() == ""  # the last one loaded: nothing to say

    asyncio.run(go())
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings and all("waiting for the learner's weights" in w for w in warnings)
    assert "gives up after 60 s" in warnings[0]


def test_a_late_failure_of_an_abandoned_join_leaves_the_newer_group_alone(served) -> None:
    """The learner moves on as soon as one server fails to join; another server's join of
    that epoch fails later, after it joined the next one: that failure must not drop it."""
    engine = served.app.state.engine
    group = object()
    engine._weight_pg, engine._weight_epoch = group, 5
    try:
        engine.leave_weight_group(4)  # the abandoned epoch's join gives up
        assert engine._weight_pg is group and engine._weight_epoch == 5
        engine.leave_weight_group(5)
        assert engine._weight_pg is None and engine._weight_epoch is None
    finally:
        engine.leave_weight_group()
