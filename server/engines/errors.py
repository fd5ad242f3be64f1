"""The engines' own failures, typed: what an engine raises on purpose, apart from whatever a
library inside it may raise.

- ``RequestRefused``: this request cannot be served as asked (a prompt too long, parameters
  out of range): the client's fault (400);
- ``EngineUnavailable``: the engine cannot generate now (stopped, its scheduler or workers
  failed): retry later (503);
- ``InvalidWeights``: pushed weights do not fit this engine (names, shapes, an adapter's rank
  or plan): the pusher's fault (400), nothing was loaded;
- ``WeightSyncFailed``: a weight transfer or load failed on the way (not a member of the
  group, a collective or a worker failed): 504, the learner retries or rebuilds the group.

Each is also the built-in error it replaces (``ValueError`` or ``RuntimeError``), so older
callers still catch it; the server catches only these types (``gspo_rl.server.api.errors``
maps them to HTTP in ``ENGINE_STATUS``): any other exception from an engine is a 500, the
server's fault, never reported as the client's.
"""

from __future__ import annotations


class EngineError(Exception):
    """A failure an engine reports on purpose."""


class RequestRefused(EngineError, ValueError):
    """The request cannot be served as asked."""


class EngineUnavailable(EngineError, RuntimeError):
    """The engine cannot generate now; nothing was sampled."""


class InvalidWeights(EngineError, ValueError):
    """Pushed weights do not fit this engine; nothing was loaded."""


class WeightSyncFailed(EngineError, RuntimeError):
    """A weight transfer or load failed on the way."""
