"""The engine interface: what the rollout server needs from an inference engine.

``Engine`` is both halves, with a lifetime (``start``, ``shutdown``): a ``SamplingEngine``
(``gspo_rl.server.engines.sampler``: generate, stream, stats, liveness) and a
``WeightReceiver`` (``gspo_rl.server.engines.receiver``: pause, resume, load the learner's
weights). The app builds, starts and stops an ``Engine``; everything else takes the half it
uses: the sampling service the sampler, the weight serving object the receiver.

The sampler's values (``SamplingParams``, ``Completion``, ``Partial``, ``EngineStats``,
``FinishReason``, ``validate_request``) are re-exported here.
"""

from __future__ import annotations

import abc

from gspo_rl.server.engines.receiver import WeightReceiver
from gspo_rl.server.engines.sampler import (
    Completion,
    EngineStats,
    FinishReason,
    Partial,
    SamplingEngine,
    SamplingParams,
    validate_request,
)

__all__ = ["Completion", "Engine", "EngineStats", "FinishReason", "Partial", "SamplingEngine",
           "SamplingParams", "WeightReceiver", "validate_request"]


class Engine(SamplingEngine, WeightReceiver):
    """An inference engine: it samples, receives weights, and starts and stops. All methods
    are called from the server's event loop."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model; return when ready to generate."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Release everything; abort requests in flight."""
