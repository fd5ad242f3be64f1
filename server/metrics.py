"""Prometheus metrics of one rollout server, in a registry owned by the app.

A per-app ``CollectorRegistry`` (not the process-global default) lets tests and benchmarks run
several apps in one process without "duplicated timeseries" errors. Request metrics are
labelled by the matched route template (``/v1/chat/completions``), never the raw path, so an
unknown URL cannot grow the label set without bound. Engine load and the policy version are
gauges refreshed when ``/metrics`` is scraped: they are point-in-time values.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gspo_rl.server.engines.sampler import SamplingEngine

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ServerMetrics:
    """The metric objects of one app; ``render`` produces the Prometheus text format."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("gspo_http_requests", "HTTP requests by route and status",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("gspo_http_request_seconds", "HTTP request latency",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("gspo_prompt_tokens", "Prompt tokens processed",
                                     ["route"], registry=r)
        self.completion_tokens = Counter("gspo_completion_tokens", "Tokens generated",
                                         ["route"], registry=r)
        self.rollouts = Counter("gspo_rollouts_recorded", "Rollouts recorded in Redis",
                                registry=r)
        self.groups = Counter("gspo_groups_created", "Groups created in Redis", registry=r)
        self.unrecorded = Counter("gspo_unrecorded_requests", "Sampling requests served with "
                                  "record: false (nothing written to Redis)", ["route"],
                                  registry=r)
        self.generation_latency = Histogram(
            "gspo_generation_seconds", "Engine time of one request's n samples",
            ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.engine_running = Gauge("gspo_engine_running", "Requests being decoded",
                                    registry=r)
        self.engine_waiting = Gauge("gspo_engine_waiting", "Requests queued in the engine",
                                    registry=r)
        self.policy_version = Gauge("gspo_policy_version", "Policy version of the weights",
                                    registry=r)
        self.disconnected = Counter("gspo_requests_disconnected", "Sampling requests "
                                    "aborted because their client disconnected", ["route"],
                                    registry=r)
        self.ready_queue_depth = Gauge("gspo_ready_queue_depth", "Groups on the ready stream "
                                       "(published, not yet acknowledged by the learner)",
                                       registry=r)
        self.ready_queue_refused = Counter("gspo_ready_queue_refused", "New groups refused "
                                           "(503) because the ready queue was at its bound",
                                           ["route"], registry=r)
        self.engine_dead = Gauge("gspo_engine_dead", "1 once the engine has died (the server "
                                 "is stopping and exits non-zero), else 0", registry=r)
        self.groups_in_flight = Gauge("gspo_groups_in_flight", "Groups admitted and not yet "
                                      "trained, dropped or expired, over every server "
                                      "(gspo_rl.redisq.inflight)", registry=r)
        self.admission_bound = Gauge("gspo_admission_bound", "Most groups in flight the "
                                     "learner's staleness bound allows (-1: no bound)",
                                     registry=r)
        self.admission_held = Gauge("gspo_admission_held", "Requests held now, waiting for "
                                    "the learner to advance", registry=r)
        self.admission_waited = Counter("gspo_admission_waited", "Requests that had "
                                            "to wait for admission", registry=r)
        self.admission_refused = Counter("gspo_admission_refused", "New groups refused (503 "
                                         "too_many_groups_in_flight) after the longest hold",
                                         ["route"], registry=r)
        self.engine_extra = Gauge("gspo_engine_stat", "Engine-specific numbers (EngineStats."
                                  "extra: decode steps, prefills, ...)", ["name"], registry=r)

    def record_usage(self, route: str, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens.labels(route).inc(prompt_tokens)
        self.completion_tokens.labels(route).inc(completion_tokens)

    def render(self, engine: SamplingEngine | None) -> bytes:
        """Refresh the point-in-time gauges from the engine, then serialise everything."""
        if engine is not None:
            stats = engine.stats()
            self.engine_running.set(stats.running)
            self.engine_waiting.set(stats.waiting)
            self.policy_version.set(engine.policy_version)
            self.engine_dead.set(1 if engine.dead_reason() is not None else 0)
            for name, value in stats.extra.items():
                self.engine_extra.labels(name).set(value)
        return generate_latest(self.registry)
