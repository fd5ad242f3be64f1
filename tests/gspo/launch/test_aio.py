"""``run_interruptible`` (gspo_rl.launch.aio): asyncio.run's result and errors without a
signal; after SIGINT or SIGTERM, ``KeyboardInterrupt`` within its grace even when a task
ignores its cancellation, and that task named in the log with its stack."""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import pytest

from gspo_rl.launch.aio import run_interruptible


async def _answer() -> int:
    await asyncio.sleep(0.01)
    return 42


async def _fails() -> None:
    await asyncio.sleep(0.01)
    raise ValueError("the environment's own error")


def test_without_a_signal_it_is_asyncio_run() -> None:
    before = signal.getsignal(signal.SIGINT)  # default_int_handler; SIG_IGN under nohup
    assert run_interruptible(_answer()) == 42
    with pytest.raises(ValueError, match="own error"):
        run_interruptible(_fails())
    assert signal.getsignal(signal.SIGINT) is before  # restored


async def _stubborn_cleanup(sig: signal.Signals, cleaned: list[str]) -> None:
    """Signals itself, then, cancelled, cleans up politely (one task) while another task
    never lets its cancellation end (a cleanup awaiting a stuck peer)."""

    async def stuck() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # swallowed: cancelled again, it goes on waiting

    asyncio.get_running_loop().create_task(stuck(), name="the-stuck-one")
    asyncio.get_running_loop().call_later(0.05, signal.raise_signal, sig)
    try:
        await asyncio.sleep(3600)
    finally:
        cleaned.append("main")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_the_run_within_its_grace_and_names_what_hung(
        sig: signal.Signals, caplog: pytest.LogCaptureFixture) -> None:
    cleaned: list[str] = []
    before = signal.getsignal(signal.SIGINT)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, "gspo_rl.launch.aio"), \
            pytest.raises(KeyboardInterrupt):
        run_interruptible(_stubborn_cleanup(sig, cleaned), grace_s=0.5)
    assert cleaned == ["main"]  # the main task's cleanup ran
    assert time.monotonic() - t0 < 30  # bounded (its grace, twice, plus the loop's closing)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "did not end within its grace" in warning and "the-stuck-one" in warning
    assert "in stuck" in warning  # its stack
    assert signal.getsignal(signal.SIGINT) is before
