"""The SDK's answer to a 503 ``training_finished`` (the learner met its target, server.admission):
wait for the server's Retry-After and try again, as for the other admission 503s (a learner
started again takes groups), saying why in a warning, not once per retry."""

from __future__ import annotations

import logging

import httpx
import pytest

from clients.client import RetryPolicy, _Attempts


def answer(code: str, message: str = "the learner finished training (target reward 0.8 "
           "reached at step 9)") -> httpx.Response:
    return httpx.Response(503, json={"error": {"code": code, "message": message}},
                          headers={"Retry-After": "10"})


def test_training_finished_is_waited_out_with_a_warning(caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    attempts = _Attempts(RetryPolicy(attempts=1))  # no failure retries: waiting is not one
    with caplog.at_level(logging.WARNING, logger="clients.client"):
        delays = [attempts.admission_delay(answer("training_finished")) for _ in range(12)]
    assert all(d is not None and 7.5 <= d <= 12.5 for d in delays)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # once a minute of 10 s waits
    assert "reached at step 9" in warnings[0] and "waiting for a learner" in warnings[0]


def test_other_503s_are_not_admission_waits() -> None:
    attempts = _Attempts(RetryPolicy())
    assert attempts.admission_delay(answer("engine_dead")) is None
    assert attempts.admission_delay(httpx.Response(502, text="bad gateway")) is None
