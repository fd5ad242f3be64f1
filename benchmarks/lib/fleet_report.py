"""The fleet simulator's printed report: markdown tables of CPU per sample (with the raw
baseline and the ratios), memory per sample in each state, the ceilings and the GPUs they
feed, and the load sweep.

Contract: ``print_report(args, assumptions, results)`` takes ``sim_fleet.sweep``'s results
(per shape: ``mem`` from ``fleet_redis.measure_memory``, ``ours`` and ``raw`` ``Point``s; the
load sweep's ``Point``s) and prints; it measures nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from benchmarks.lib.fleet_model import (
    AdmissionCost,
    Assumptions,
    Ceilings,
    ceilings,
    fmt_bytes,
    fmt_gpus,
    fmt_rate,
    gpus,
    gpus_at_redis_cpu,
)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "-"


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(head: list[str], rows: list[list[Any]]) -> None:
    print(_row(head))
    print(_row(["---"] * len(head)))
    for r in rows:
        print(_row(r))


def print_cpu(args: argparse.Namespace, shapes: list[dict]) -> None:
    print(f"\n1. CPU per generated sample, {args.shape_servers} simulated servers as fast as "
          f"they can, {args.drop_fraction:.0%} of groups dropped (us; raw baseline: XADD + "
          "XREADGROUP + XACK of the published groups' bytes)")
    rows = []
    for s in shapes:
        o, r = s["ours"], s["raw"]
        rows.append([s["shape"].name, f"{o.tokens:,.0f} ({o.completion:,.0f})", o.samples,
                     f"{o.redis_us:,.0f} ({r.redis_us:,.0f})", _ratio(o.redis_us, r.redis_us),
                     f"{o.redis_us / (o.tokens / 1000):.1f}",
                     f"{o.redis_all_us:,.0f} / {o.redis_children_us:,.0f}",
                     f"{o.reader_us:,.0f} ({r.reader_us:,.0f})", _ratio(o.reader_us, r.reader_us),
                     f"{o.writer_us:,.0f} ({r.writer_us:,.0f})", _ratio(o.writer_us, r.writer_us)])
    _table(["shape (tokens x group)", "tokens/sample (generated)", "samples",
            "Redis main thread (raw)", "ratio ours/raw Redis", "Redis per 1k tokens",
            "Redis all threads / AOF rewrite", "reader (raw)", "ratio ours/raw reader",
            "store clients (raw)", "ratio ours/raw clients"], rows)


def _held(m: dict[str, float], kind: str, per: str) -> str:
    """Records (per ``per``) and tombstone (per group) held, with their TTLs."""
    return (f"{fmt_bytes(m[kind + '_records'])}{per} ({m[kind + '_records_ttl_s']:.0f} s) + "
            f"{fmt_bytes(m[kind + '_tomb'])} ({m[kind + '_tomb_ttl_s']:.0f} s)")


def print_memory(args: argparse.Namespace, shapes: list[dict], cs: list[Ceilings]) -> None:
    bound = (args.max_staleness + 1) * args.groups_per_step
    print(f"\n2. Redis memory per sample (INFO used_memory deltas); at the bound: "
          f"(max_staleness {args.max_staleness} + 1) x {args.groups_per_step} groups per step"
          f" = {bound:,} groups recorded and unread; retention at {args.drop_fraction:.0%} "
          "dropped (records + tombstones, each for its measured TTL)")
    rows = []
    for s, c in zip(shapes, cs, strict=True):
        m = s["mem"]
        rows.append([s["shape"].name, fmt_bytes(m["record_bytes"]), fmt_bytes(m["open"]),
                     fmt_bytes(m["unread"]), fmt_bytes(m["raw"]), _ratio(m["unread"], m["raw"]),
                     _held(m, "dropped", ""), _held(m, "trained", "/sample"),
                     fmt_bytes(c.bound_bytes), fmt_bytes(c.retention_s_bytes),
                     fmt_bytes(c.retention_600_s_bytes)])
    _table(["shape", "packed record", "open (awaiting rewards)", "published unread",
            "raw stream entry", "ratio ours/raw", "held per DROPPED group: records (TTL) + "
            "tombstone (TTL)", "held per trained group: records (TTL) + tombstone (TTL)",
            "at the bound", "retention per 1 sample/s",
            "same, dropped records kept 600 s"], rows)


def fed(args: argparse.Namespace, s: dict, c: Ceilings, adm: AdmissionCost,
        rate: float) -> tuple[float, str]:
    """GPUs one Redis + one reader feed at ``rate`` tokens/s per GPU, and the first limit."""
    o = s["ours"]
    n_redis = gpus_at_redis_cpu(o.redis_us, args.shape_servers, adm, o.completion,
                                s["shape"].group, rate, args.gpus_per_server)
    return min((n_redis, "Redis CPU"), (gpus(c.reader, o.completion, rate), "reader CPU"),
               (gpus(c.memory, o.completion, rate), "Redis memory"))


def print_ceilings(args: argparse.Namespace, shapes: list[dict], cs: list[Ceilings],
                   adm: AdmissionCost) -> None:
    rates = args.gpu_tokens_per_s
    print(f"\n5. Ceilings in generated samples/s (completion tokens/s): one Redis main thread "
          f"(at {args.shape_servers} servers), one reader process, {args.memory_gib:g} GiB of "
          "Redis memory; GPUs fed at an ASSUMED per-H100 Qwen3-8B generation rate, one server "
          f"per {args.gpus_per_server:g} GPU(s), the admission read's growth with the servers "
          "included (first limit in brackets)")
    rows = []
    for s, c in zip(shapes, cs, strict=True):
        comp = s["ours"].completion
        rows.append([s["shape"].name, f"{fmt_rate(c.redis)} ({fmt_rate(c.redis * comp)})",
                     f"{fmt_rate(c.reader)} ({fmt_rate(c.reader * comp)})",
                     f"{fmt_rate(c.memory)} ({fmt_rate(c.memory * comp)})",
                     fmt_rate(c.memory_tombs_only),
                     *[f"{fmt_gpus(n)} ({first})"
                       for n, first in (fed(args, s, c, adm, r) for r in rates)],
                     fmt_bytes(c.memory_at(min(c.redis, c.reader)))])
    _table(["shape", "Redis CPU", "reader CPU", "Redis memory",
            "memory, no records kept after the end",
            *[f"GPUs @ {r:,.0f} tok/s" for r in rates],
            "memory at the Redis or reader CPU ceiling"], rows)


def print_admission(adm: dict | None) -> AdmissionCost:
    if adm is None:
        return AdmissionCost()
    a, b = adm["fit"]
    print("\n4. One admission read (IN_FLIGHT_FACTS, one per group a server starts) against the "
          "number of servers: Redis main-thread CPU per read")
    _table(["servers", "us per read"], [[f"{n:,}", f"{u:,.1f}"]
                                        for n, u in zip(adm["servers"], adm["us"], strict=True)])
    print(f"   fit: {a:.1f} + {b:.3f} x servers us per read; Redis spends fleet-wide "
          "servers x (groups/s per server) x that (a term in the square of the fleet's size "
          "where the slope is not ~0; the GPU counts below use the measured points, "
          "interpolated)")
    return AdmissionCost(adm["servers"], adm["us"])


def print_load(args: argparse.Namespace, load: list[dict], shape: Any) -> None:
    if not load:
        return
    print(f"\n3. Load sweep at {shape.name}: simulated servers x target samples/s "
          "(0: as fast as they can); CPU us per generated sample")
    rows = [[x["servers"], f"{x['rate']:g}", f"{x['ours'].wall_per_s:,.0f}",
             f"{x['ours'].redis_us:,.0f}", f"{x['ours'].reader_us:,.0f}",
             f"{x['ours'].writer_us:,.0f}"] for x in load]
    _table(["servers", "target samples/s", "wall samples/s (load-dependent)", "Redis main",
            "reader", "store clients"], rows)
    fast = [x for x in load if x["rate"] == 0]
    if len({x["servers"] for x in fast}) > 1:
        k = np.polyfit([x["servers"] for x in fast], [x["ours"].redis_us for x in fast], 1)[0]
        print(f"   Redis CPU per sample vs servers (unpaced, least squares): {100 * k:+.1f} us "
              f"per 100 servers (each server's per-second work, its connection and the "
              f"admission read's growth, if any: table 4)")


def print_report(args: argparse.Namespace, a: Assumptions, results: dict) -> None:
    shapes = results["shapes"]
    cs = [ceilings(s["ours"].redis_us, s["ours"].reader_us, s["mem"], s["shape"].group, a)
          for s in shapes]
    print_cpu(args, shapes)
    print_memory(args, shapes, cs)
    print_load(args, results["load"], results["load_shape"])
    adm = print_admission(results.get("admission"))
    print_ceilings(args, shapes, cs, adm)
    print("\nsummary: one Redis + one reader feed (GPUs at "
          + " / ".join(f"{r:,.0f}" for r in args.gpu_tokens_per_s) + " generated tok/s each)")
    for s, c in zip(shapes, cs, strict=True):
        n = " / ".join(f"{fmt_gpus(x)} ({first})" for x, first in
                       (fed(args, s, c, adm, r) for r in args.gpu_tokens_per_s))
        print(f"   {s['shape'].name:>10}: {n}")
