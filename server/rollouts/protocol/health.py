"""``GET /health``: the server's readiness (engine, Redis, the learner as the queue shows it)
and what a person must know about it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

RedisState = Literal["ok", "unreachable", "out_of_memory"]


class LearnerHealth(BaseModel):
    connected: bool
    """Its heartbeat is at most 30 s old (``gspo_rl.contract.admission.learner_connected``)."""
    last_seen_s: float | None
    """Seconds since its last heartbeat (None: no learner ever beat)."""
    version: int
    finished: str
    """Why it stopped taking groups (its goal was met); empty while it trains."""
    message: str | None = None
    """What to do when none is connected."""


class HealthResponse(BaseModel):
    status: Literal["ok", "degraded", "dead"]
    engine: str
    model: str
    model_path: str
    policy_version: int
    server_id: str
    redis: RedisState
    running: int
    waiting: int
    engine_error: str | None = None
    """Why the engine died ("status": "dead"): the server is stopping and exits non-zero."""
    warnings: list[str] = []
    """What a person must know about this server: e.g. ``insecure_no_auth`` (it listens
    beyond loopback with no API key)."""
    learner: LearnerHealth | None = None
    """The learner as the queue shows it (None: this server runs without admission)."""
