"""The errors a scoring call raises (``ScoringPool.score``): ``ScoringError`` and its kinds.

``ScoringError`` carries the qualified name of the scorer's exception type ("" for a timeout,
a crash, a closed pool), its message and the worker's traceback text, and pickles with them;
``ScoringTimeout``: a call ran past the pool's limit; ``ScoringCrashed``: a worker died or could
not start. ``RemoteTraceback``: the worker's traceback, chained onto the error raised here.
"""

from __future__ import annotations

from typing import Any


class ScoringError(Exception):
    """A scoring call failed: ``exc_type`` (the qualified name of the scorer's exception; ""
    for a timeout, a crash, a closed pool), ``message`` and ``traceback_text`` (the
    worker's)."""

    def __init__(self, exc_type: str, message: str, traceback_text: str = "") -> None:
        super().__init__(f"{exc_type}: {message}" if exc_type else message)
        self.exc_type, self.message, self.traceback_text = exc_type, message, traceback_text

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.exc_type, self.message, self.traceback_text)


class ScoringTimeout(ScoringError):
    """A call ran past the pool's ``timeout_s``: its worker was killed."""


class ScoringCrashed(ScoringError):
    """A worker died (or could not start) during a call."""


class RemoteTraceback(Exception):
    """The worker's traceback, chained as ``__cause__`` so that it shows when raised."""

    def __str__(self) -> str:
        return f"\n{self.args[0]}" if self.args else ""
