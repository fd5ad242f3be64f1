"""The async benchmarks run to the end at tiny sizes (``tests/benchmarks/smoke.py``)."""

from __future__ import annotations

import pytest

from tests.benchmarks.smoke import AREAS, run_case


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", AREAS["async"])
def test_benchmark_runs_at_tiny_sizes(name, tmp_path):
    run_case(name, tmp_path)
