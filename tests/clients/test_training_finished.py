"""The SDK's answer to a 503 ``training_finished`` (the learner met its target,
gspo_rl.server.rollouts.admission): wait for the server's Retry-After and try again, as for the
other admission 503s (a learner started again takes groups), saying why in a warning, not once per
retry."""

from __future__ import annotations

import logging
import math

import httpx
import pytest

import gspo_rl.client.client as client_module
from gspo_rl.client.client import RetryPolicy, _Attempts


def answer(code: str, message: str = "the learner finished training (target reward 0.8 "
           "reached at step 9)") -> httpx.Response:
    return httpx.Response(503, json={"error": {"code": code, "message": message}},
                          headers={"Retry-After": "10"})


def test_training_finished_is_waited_out_with_one_warning_a_minute(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(client_module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(client_module, "_finished_warned_at", -math.inf)
    waiting = [_Attempts(RetryPolicy(attempts=1)) for _ in range(8)]  # 8 requests held
    with caplog.at_level(logging.WARNING, logger="gspo_rl.client.client"):
        for _ in range(7):  # 70 s of 10 s waits
            delays = [a.admission_delay(answer("training_finished")) for a in waiting]
            assert all(d is not None and 7.5 <= d <= 12.5 for d in delays)
            clock[0] += 10.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # at 0 s and at 60 s, not once per request
    assert "reached at step 9" in warnings[0] and "waiting for a learner" in warnings[0]


def test_other_503s_are_not_admission_waits() -> None:
    attempts = _Attempts(RetryPolicy())
    assert attempts.admission_delay(answer("engine_dead")) is None
    assert attempts.admission_delay(httpx.Response(502, text="bad gateway")) is None
