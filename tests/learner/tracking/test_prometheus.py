"""The learner's Prometheus exporter (gspo_rl.learner.tracking.prometheus): step records and
evaluations become gauges, served over real HTTP on a free port and parsed back with
prometheus_client's own parser; the port closes with the tracker."""

from __future__ import annotations

import math

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gspo_rl.learner.tracking.base import RunInfo, Tracker, check_installed, flatten
from gspo_rl.learner.tracking.metrics import eval_record
from gspo_rl.learner.tracking.prometheus import GAUGES, PREFIX, PrometheusBackend

STEP = {"event": "step", "step": 7, "version": 9, "time": 1.0, "run_id": "r", "loss": 0.25,
        "reward_mean": 0.5, "reward_trained": 0.5, "reward_sampled": 0.625, "env_reward": 0.625,
        "clip_fraction": 0.125, "grad_norm": 1.5, "tokens_per_s": 900.0,
        "trained_group_fraction": 0.75, "trained_token_fraction": 0.5,
        "groups_generated_total": 40, "groups_trained_total": 30,
        "is_weight_capped_fraction": 0.0625, "time_wait_s": 0.5, "time_compute_s": 2.0,
        "time_sync_s": 0.25, "staleness": {"0": 2, "2": 2},
        "dropped": {"dropped_stale": 3, "dropped_zero_variance": 5}, "group_ids": ["a"]}


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_step_records_and_evaluations_become_gauges(tmp_path) -> None:
    check_installed(["prometheus"])  # the core install has prometheus_client
    backend = PrometheusBackend(RunInfo(tmp_path, {"prometheus_port": 0}))
    tracker = Tracker([backend])
    try:
        before = scrape(backend.port)
        assert math.isnan(before[(PREFIX + "loss", ())])  # nothing logged yet: no false 0
        tracker.log(STEP, 7)
        tracker.log(STEP | {"step": 8, "loss": 0.125}, 8)
        tracker.log(eval_record("1-0", {"name": "math", "policy_version": 9,
                                        "metrics": {"pass@1": 0.4}}, "r", 8), 8)
        tracker.log_samples(8, [{"step": 8}])  # a table: no metric, no error
        got = scrape(backend.port)
    finally:
        tracker.close()
    g = {name.removeprefix(PREFIX): v for (name, labels), v in got.items() if not labels}
    assert g["step"] == 8 and g["policy_version"] == 9 and g["loss"] == 0.125
    assert g["reward_trained"] == 0.5 and g["reward_sampled"] == 0.625
    assert g["clip_fraction"] == 0.125 and g["grad_norm"] == 1.5
    assert g["tokens_per_second"] == 900.0 and g["groups_generated"] == 40
    assert g["trained_group_fraction"] == 0.75 and g["trained_token_fraction"] == 0.5
    assert g["groups_trained"] == 30 and g["is_weight_capped_fraction"] == 0.0625
    assert g["staleness_mean"] == 1.0 and g["step_seconds"] >= 0.0
    assert g["last_step_timestamp_seconds"] > 1e9
    assert got[(PREFIX + "step_phase_seconds", (("phase", "compute"),))] == 2.0
    assert got[(PREFIX + "dropped", (("reason", "dropped_stale"),))] == 3
    assert got[(PREFIX + "eval", (("metric", "pass@1"), ("set", "math")))] == 0.4
    assert set(GAUGES) <= set(g)
    with pytest.raises(httpx.TransportError):  # closed with the tracker
        httpx.get(f"http://127.0.0.1:{backend.port}/metrics", timeout=2)


def test_flattened_names_are_what_the_exporter_reads() -> None:
    flat = flatten(STEP)
    assert all(field in flat for field, _ in GAUGES.values())


def test_a_taken_port_fails_the_start(tmp_path) -> None:
    first = PrometheusBackend(RunInfo(tmp_path, {"prometheus_port": 0}))
    try:
        with pytest.raises(OSError):
            PrometheusBackend(RunInfo(tmp_path, {"prometheus_port": first.port}))
    finally:
        first.close()
