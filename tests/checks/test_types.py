"""The type checker over the whole package (``scripts/typecheck.sh``: mypy, pinned in the lock).

Every module of ``gspo_rl`` is checked as installed (the script lays the folders out as the
namespace), with ``[tool.mypy]`` in pyproject.toml: strict on ``gspo_rl.contract`` (what both
sides share) and ``gspo_rl.client`` (the environment SDK), the default checks elsewhere. A
``# type: ignore`` names its error code and why (a library's types that are wrong or dynamic).
Slow without mypy's cache (about a minute here; ``scripts/typecheck.sh`` keeps it per machine).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_package_type_checks() -> None:
    run = subprocess.run(["bash", "scripts/typecheck.sh"], cwd=REPO, capture_output=True,
                         text=True, timeout=590)
    assert run.returncode == 0, f"scripts/typecheck.sh failed:\n{run.stdout}{run.stderr}"
