"""From measured costs per sample to fleet ceilings: the samples/s at which one Redis core, one
learner-side reader or a Redis memory budget runs out, and how many GPUs that feeds.

Contract: every rate is in *generated* samples per second (what the servers emit, dropped
groups included; the reader's cost per read sample is spread over them at the drop
fraction). ``ceilings`` takes the CPU per generated sample (Redis main thread, reader), the
memory figures of ``fleet_redis.measure_memory`` and the ``Assumptions`` (staleness bound,
groups per step, memory budget, drop fraction, retention TTLs), and returns each ceiling, the
memory held at the staleness bound and the memory a sample rate holds through retention
(records of trained groups kept ``keep_trained_s``, of dropped ones ``dropped_records_ttl_s``,
tombstones ``finished_ttl_s``: the TTLs measured); ``gpus`` and
``gpus_at_redis_cpu`` turn a ceiling into GPUs at a per-GPU generation rate (completion
tokens/s), the latter with the admission read's cost growing with the number of servers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

GIB = 1024 ** 3


@dataclass(frozen=True)
class Assumptions:
    """The fleet's settings; the TTLs are fallbacks for keys whose TTL was not measured."""

    drop_fraction: float
    max_staleness: int
    groups_per_step: int
    memory_budget: float  # bytes
    keep_trained_s: float  # what the reader's ack leaves a trained group's records
    finished_ttl_s: float  # what a finished group's tombstone (state, rewards, ids) keeps
    dropped_records_ttl_s: float  # what a dropped group's records keep


@dataclass(frozen=True)
class Ceilings:
    redis: float  # generated samples/s at one saturated Redis core
    reader: float  # ... at one saturated reader process
    memory: float  # ... at which retention + the bound fill the memory budget
    bound_bytes: float  # held by the in-flight + published-unread groups at the bound
    retention_s_bytes: float  # bytes held per (generated sample/s) through retention
    retention_600_s_bytes: float  # ... were dropped groups' records kept finished_ttl_s
    memory_tombs_only: float  # the memory ceiling were no records kept (TTLs 0: tombstones only)

    def memory_at(self, rate: float) -> float:
        """Bytes Redis holds at ``rate`` generated samples/s (bound + retention)."""
        return self.bound_bytes + rate * self.retention_s_bytes


def _per_second(cost_s: float) -> float:
    return 1.0 / cost_s if cost_s > 0 else math.inf


def _ttl(measured: float, fallback: float) -> float:
    """A measured TTL (-2: the key was gone, so nothing held; -1: none set) or the fallback."""
    return math.ceil(measured) if measured >= 0 else (0.0 if measured == -2 else fallback)


def retention(mem: dict[str, float], group: int, a: Assumptions,
              dropped_records_ttl_s: float | None = None,
              trained_records_ttl_s: float | None = None) -> float:
    """Bytes held per (generated sample/s) by finished groups: records and tombstones, each
    times its TTL (the measured one unless given), weighted by the drop fraction (``mem``:
    ``measure_memory``'s figures)."""
    def b(key: str) -> float:
        return max(0.0, mem[key])

    def ttl(given: float | None, key: str, fallback: float) -> float:
        return given if given is not None else _ttl(mem[key], fallback)

    keep = ttl(trained_records_ttl_s, "trained_records_ttl_s", a.keep_trained_s)
    trained = (b("trained_records") * group * keep
               + b("trained_tomb") * _ttl(mem["trained_tomb_ttl_s"], a.finished_ttl_s))
    rec_ttl = ttl(dropped_records_ttl_s, "dropped_records_ttl_s", a.dropped_records_ttl_s)
    dropped = (b("dropped_records") * rec_ttl
               + b("dropped_tomb") * _ttl(mem["dropped_tomb_ttl_s"], a.finished_ttl_s))
    return ((1 - a.drop_fraction) * trained + a.drop_fraction * dropped) / group


def ceilings(redis_us: float, reader_us: float, mem: dict[str, float], group: int,
             a: Assumptions) -> Ceilings:
    """``redis_us`` / ``reader_us``: CPU microseconds per generated sample."""
    bound_groups = (a.max_staleness + 1) * a.groups_per_step
    bound = bound_groups * group * max(mem["unread"], mem["open"])
    room = a.memory_budget - bound

    def fits(kept: float) -> float:
        return 0.0 if room <= 0 else (room / kept if kept > 0 else math.inf)

    kept = retention(mem, group, a)
    return Ceilings(redis=_per_second(redis_us * 1e-6), reader=_per_second(reader_us * 1e-6),
                    memory=fits(kept), bound_bytes=bound, retention_s_bytes=kept,
                    retention_600_s_bytes=retention(mem, group, a, a.finished_ttl_s),
                    memory_tombs_only=fits(retention(mem, group, a, 0.0, 0.0)))


def gpus(samples_per_s: float, completion_per_sample: float, gpu_tokens_per_s: float) -> float:
    """GPUs whose generation (completion tokens/s each) makes ``samples_per_s``."""
    return samples_per_s * completion_per_sample / gpu_tokens_per_s


class AdmissionCost:
    """Redis CPU us of one admission read at ``servers`` servers: piecewise linear through the
    measured points, extended along the last segment (none measured: free)."""

    def __init__(self, servers: list[int] | None = None, us: list[float] | None = None) -> None:
        self.servers, self.us = list(servers or []), list(us or [])

    def __call__(self, servers: float) -> float:
        xs, ys = self.servers, self.us
        if not xs:
            return 0.0
        if len(xs) == 1 or servers <= xs[-1]:
            return float(np.interp(servers, xs, ys))
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (servers - xs[-1])


def gpus_at_redis_cpu(sample_us: float, s0: int, adm: AdmissionCost, completion: float,
                      group: int, gpu_tokens_per_s: float, gpus_per_server: float) -> float:
    """GPUs whose samples saturate one Redis core, with the admission read's growth: each
    generated sample costs ``sample_us`` less the admission read measured in it (at ``s0``
    servers), and each group one read at the fleet's server count (one server per
    ``gpus_per_server`` GPUs): the N where ``N r c0 + (N / g) (r / G) adm(N / g)`` reaches one
    core (r: one GPU's samples/s), by bisection."""
    r = gpu_tokens_per_s / completion  # samples/s of one GPU
    c0 = max(0.0, sample_us - adm(s0) / group) * 1e-6

    def load(n: float) -> float:
        servers = n / gpus_per_server
        return n * r * c0 + servers * r / group * adm(servers) * 1e-6

    lo, hi = 0.0, 1.0
    while load(hi) < 1.0:
        lo, hi = hi, hi * 2
        if hi > 1e9:
            return math.inf
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if load(mid) < 1.0 else (lo, mid)
    return lo


def fmt_rate(x: float) -> str:
    if math.isinf(x):
        return "inf"
    return f"{x / 1e6:.1f}M" if x >= 1e6 else (f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}")


def fmt_bytes(x: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(x) >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} B"


def fmt_gpus(x: float) -> str:
    return "inf" if math.isinf(x) else (f"{x:,.0f}" if x >= 10 else f"{x:.1f}")
