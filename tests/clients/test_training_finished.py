"""The SDK's answer to a 503 ``training_finished`` (the learner met its target,
gspo_rl.server.rollouts.admission): wait for the server's Retry-After and try again, as for the
other admission 503s (a learner started again takes groups), saying why in a warning (at most every
30 s, whatever the number of requests waiting), not once per retry."""

from __future__ import annotations

import logging

import httpx
import pytest

import gspo_rl.client.retry as retry_module
from gspo_rl.client.retry import Attempts, RetryPolicy, Throttle


def answer(code: str, message: str = "the learner finished training (target reward 0.8 "
           "reached at step 9)") -> httpx.Response:
    return httpx.Response(503, json={"error": {"code": code, "message": message}},
                          headers={"Retry-After": "10"})


def test_training_finished_is_waited_out_with_a_warning_every_30_s(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(retry_module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(retry_module, "FINISHED_SAID", Throttle())
    waiting = [Attempts(RetryPolicy(attempts=1)) for _ in range(8)]  # 8 requests held
    with caplog.at_level(logging.WARNING, logger="gspo_rl.client.client"):
        for _ in range(7):  # 70 s of 10 s waits
            delays = [a.admission_delay(answer("training_finished")) for a in waiting]
            assert all(d is not None and 7.5 <= d <= 12.5 for d in delays)
            clock[0] += 10.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3  # at 0, 30 and 60 s, not once per request
    assert "reached at step 9" in warnings[0] and "waiting for a learner" in warnings[0]


def test_an_admission_wait_says_its_cause_every_30_s(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's message names the cause (groups in flight at the bound, idle ones...)."""
    clock = [1000.0]
    monkeypatch.setattr(retry_module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(retry_module, "ADMISSION_SAID", Throttle())
    held = answer("too_many_groups_in_flight", "12 groups are in flight (12 open, 0 complete)")
    waiting = [Attempts(RetryPolicy(), "POST /v1/rollouts") for _ in range(4)]
    with caplog.at_level(logging.WARNING, logger="gspo_rl.client.client"):
        for _ in range(10):  # 100 s of 10 s waits
            assert all(a.admission_delay(held) is not None for a in waiting)
            clock[0] += 10.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4  # at 0, 30, 60 and 90 s
    assert "12 open" in warnings[0] and "POST /v1/rollouts" in warnings[0]
    assert "for 90 s" in warnings[-1]


def test_other_503s_are_not_admission_waits() -> None:
    attempts = Attempts(RetryPolicy())
    assert attempts.admission_delay(answer("engine_dead")) is None
    assert attempts.admission_delay(httpx.Response(502, text="bad gateway")) is None


def test_no_learner_is_said_at_once_or_after_a_grace(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """503 ``no_learner_connected``: said at the first refusal by default; with
    ``no_learner_grace_s`` (``gspo up``, whose own learner is starting) only once a request has
    waited that long."""
    clock = [1000.0]
    monkeypatch.setattr(retry_module.time, "monotonic", lambda: clock[0])
    refused = answer("no_learner_connected", "no learner is connected (no learner has been "
                     "seen yet): start one (gspo learn)")
    for grace, said_at in ((0.0, 0.0), (120.0, 120.0)):
        monkeypatch.setattr(retry_module, "ADMISSION_SAID", Throttle())
        caplog.clear()
        start = clock[0]
        attempts = Attempts(RetryPolicy(no_learner_grace_s=grace), "POST /v1/rollouts")
        first: float | None = None
        with caplog.at_level(logging.WARNING, logger="gspo_rl.client.client"):
            for _ in range(15):  # 150 s of 10 s waits
                assert attempts.admission_delay(refused) is not None
                if first is None and caplog.records:
                    first = clock[0] - start
                clock[0] += 10.0
        assert first == said_at, (grace, first)
        assert "no learner is connected" in caplog.records[0].getMessage()
