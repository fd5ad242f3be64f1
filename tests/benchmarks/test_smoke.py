"""Every script in benchmarks/ runs to the end at tiny sizes (a smoke test, no timings asserted).

A benchmark that nobody runs rots silently (issue 17: two of them crashed at HEAD for weeks).
The cases are in ``tests/benchmarks/smoke.py``, one test module per area
(``test_smoke_<area>.py``); this one checks that every script has a case in some area.
"""

from __future__ import annotations

from tests.benchmarks.smoke import AREAS, BENCH, CASES


def test_every_benchmark_script_has_a_smoke_case():
    scripts = {p.name for p in BENCH.glob("*.py") if p.name != "__init__.py"}
    covered = {name.split()[0] for name in CASES}
    assert scripts == covered, f"benchmarks without a smoke case: {scripts - covered}"


def test_every_case_runs_in_exactly_one_area():
    placed = [name for names in AREAS.values() for name in names]
    assert sorted(placed) == sorted(CASES), "a smoke case in no area, or in two"
