"""The errors the rollout layer raises, in its own terms: what is wrong with a request, never
an HTTP status. ``gspo_rl.server.api.errors`` maps each ``Problem`` to a status in one table,
as it does for the Redis layer's ``StoreError``."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Problem(StrEnum):
    """Why a request cannot be served."""

    INVALID = "invalid"  # the request is malformed or asks for what this server refuses
    NOT_FOUND = "not_found"  # it names something this server does not have (a model)
    CONFLICT = "conflict"  # it contradicts what was recorded before (an episode's history)
    UNPROCESSABLE = "unprocessable"  # well-formed, but outside a bound (a group's size)
    UNSUPPORTED = "unsupported"  # this server cannot do it at all
    UNAVAILABLE = "unavailable"  # not now: retry after ``retry_after_s``


class RolloutError(Exception):
    """A refusal with a human message and a short machine ``code`` (the OpenAI-style error
    body's ``code``); ``retry_after_s`` for the problems a client should retry."""

    def __init__(self, problem: Problem, message: str, code: str | None = None,
                 retry_after_s: int | None = None, details: Any = None) -> None:
        super().__init__(message)
        self.problem = problem
        self.message = message
        self.code = code
        self.retry_after_s = retry_after_s
        self.details = details


def invalid(message: str, code: str | None = None) -> RolloutError:
    return RolloutError(Problem.INVALID, message, code)


def conflict(message: str, code: str | None = None) -> RolloutError:
    return RolloutError(Problem.CONFLICT, message, code)


def not_found(message: str, code: str | None = None) -> RolloutError:
    return RolloutError(Problem.NOT_FOUND, message, code)


def unsupported(message: str, code: str | None = None) -> RolloutError:
    return RolloutError(Problem.UNSUPPORTED, message, code)


def unavailable(message: str, code: str | None = None,
                retry_after_s: int | None = None) -> RolloutError:
    return RolloutError(Problem.UNAVAILABLE, message, code, retry_after_s)
