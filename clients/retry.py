"""When the SDK tries a request again, and what it says while it waits.

``RetryPolicy``: connection errors, timeouts and 502/503/504 are retried with exponential
backoff for ``attempts``; 4xx never are. A 503 that holds a new group back (admission:
``too_many_groups_in_flight``, ``ready_queue_full``, ``training_finished``,
``no_learner_connected``) is backpressure,
not a failure: retried after the server's ``Retry-After`` for ``admission_patience_s``,
without using up ``attempts``. A patient request (posting rewards, abandoning a group: both
idempotent, and the only ways a group ends early) rides out a server restart: retried past
``attempts``, every ``max_delay_s`` at most, for ``outage_patience_s``; a reward that fails
for good would leave its group open until its deadline.

Every wait that lasts is said, at WARNING (what ``gspo env`` shows), at most every
``SAY_EVERY_S`` per process whatever the number of waiting requests: why the server holds new
groups back (its own message names the cause), how long it has been unreachable, and that
the learner finished.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from gspo_rl.client.errors import ServerUnavailable, error_for_status

RETRY_STATUS = frozenset({502, 503, 504})
ADMISSION_CODES = frozenset({"too_many_groups_in_flight", "ready_queue_full",
                             "training_finished", "no_learner_connected"})
FINISHED_CODE = "training_finished"
NO_LEARNER_CODE = "no_learner_connected"
SAY_EVERY_S = 30.0
MAX_RETRY_AFTER_S = 30.0
log = logging.getLogger("gspo_rl.client.client")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter; ``attempts`` includes the first try."""

    attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0
    admission_patience_s: float | None = None
    """How long to keep retrying a request the server holds back for admission (503
    ``too_many_groups_in_flight`` / ``ready_queue_full``); None: as long as it takes."""
    outage_patience_s: float | None = 600.0
    """How long a patient request (rewards, abandoning a group) keeps being retried while the
    server is unreachable or answers 502/503/504, e.g. while it restarts. 600 s: the default
    ``group_ttl_s``, after which its group has expired anyway; None: until it lands."""
    quiet_when_finished: bool = False
    """Wait for a new learner after ``training_finished`` without saying so (``gspo up``:
    the run is ending, the wait is expected)."""
    no_learner_grace_s: float = 0.0
    """Say "no learner is connected" (503 ``no_learner_connected``) only once a request has
    waited this long (``gspo up``: its own learner is starting, and it reports one that
    exits)."""

    def delays(self) -> Iterator[float]:
        for i in range(self.attempts - 1):
            yield self.delay(i)

    def delay(self, i: int) -> float:
        backoff: float = self.base_delay_s * 2**i  # (int ** int is typed Any)
        return min(self.max_delay_s, backoff) * (0.5 + random.random())


class Throttle:
    """True at most once every ``every_s`` (per process: one line, not one per request)."""

    def __init__(self, every_s: float = SAY_EVERY_S) -> None:
        self.every_s = every_s
        self.last = -float("inf")

    def due(self) -> bool:
        now = time.monotonic()
        if now - self.last < self.every_s:
            return False
        self.last = now
        return True


ADMISSION_SAID = Throttle()
FINISHED_SAID = Throttle()
OUTAGE_SAID = Throttle()


def error_message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]


def _code(resp: httpx.Response) -> str | None:
    try:
        return str(resp.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


class Attempts:
    """The retry state of one request ``what`` ("POST /v1/rewards"): backoff for failures, a
    clock for admission and outages. ``patient``: outages are waited out."""

    def __init__(self, policy: RetryPolicy, what: str = "", patient: bool = False) -> None:
        self.policy = policy
        self.what = what
        self.patient = patient
        self.delays = policy.delays()
        self.started = time.monotonic()
        self.failures = 0

    def admission_delay(self, resp: httpx.Response) -> float | None:
        """The wait before retrying a 503 that held a new group back; None: not such a 503,
        or out of patience."""
        if resp.status_code != 503:
            return None
        code = _code(resp)
        patience = self.policy.admission_patience_s
        waited = time.monotonic() - self.started
        if code not in ADMISSION_CODES or (patience is not None and waited > patience):
            return None
        if code == FINISHED_CODE:
            if not self.policy.quiet_when_finished and FINISHED_SAID.due():
                log.warning("%s: waiting for a learner to start again", error_message(resp))
        elif code == NO_LEARNER_CODE:
            if waited >= self.policy.no_learner_grace_s and ADMISSION_SAID.due():
                log.warning("%s: %s; waiting for a learner (%.0f s so far)", self.what,
                            error_message(resp), waited)
        elif ADMISSION_SAID.due():
            log.warning("%s: the server holds new groups back (%s) for %.0f s: %s; waiting, "
                        "as the learner trains or in-flight groups end", self.what, code,
                        waited, error_message(resp))
        try:
            after = float(resp.headers.get("Retry-After", "1"))
        except ValueError:
            after = 1.0
        return min(MAX_RETRY_AFTER_S, max(0.05, after)) * (0.75 + 0.5 * random.random())

    def failure_delay(self, err: Exception) -> float | None:
        """The wait before retrying a failed attempt; None: give up."""
        self.failures += 1
        delay = next(self.delays, None)
        if delay is not None or not self.patient:
            return delay
        patience = self.policy.outage_patience_s
        away = time.monotonic() - self.started
        if patience is not None and away > patience:
            return None
        if OUTAGE_SAID.due():
            limit = "until it answers" if patience is None else f"for up to {patience:g} s"
            log.warning("%s: the server has not answered for %.0f s (%s: %s); retrying %s "
                        "(it is idempotent: nothing is stored twice)", self.what, away,
                        type(err).__name__, err, limit)
        return self.policy.delay(self.failures)


Outcome = httpx.Response | httpx.TransportError


def parse(resp: httpx.Response) -> Any:
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    if resp.status_code >= 400:
        raise error_for_status(resp.status_code, body)
    return body


def after_attempt(outcome: Outcome, attempts: Attempts) -> tuple[Any, float | None]:
    """The retry policy, shared by the sync and async clients: ``(body, None)`` when the
    attempt is final (a 4xx raises its error), ``(None, delay)`` to wait and try again (an
    admission 503 while patience lasts; a 502/503/504 or a transport error while the
    backoff delays, or for a patient request the outage patience, last),
    ``ServerUnavailable`` after."""
    if isinstance(outcome, httpx.Response):
        if outcome.status_code not in RETRY_STATUS:
            return parse(outcome), None
        held = attempts.admission_delay(outcome)
        if held is not None:
            return None, held
        err: Exception = error_for_status(outcome.status_code, outcome.text)
    else:
        err = outcome
    delay = attempts.failure_delay(err)
    if delay is None:
        raise ServerUnavailable(f"{attempts.what} failed after retries: {err}") from err
    return None, delay
