"""The committed API reference (docs/openapi.json) matches the code."""

from __future__ import annotations

from scripts.export_openapi import OUT, generate


def test_committed_openapi_is_current():
    assert OUT.read_text() == generate(), "run: .venv/bin/python scripts/export_openapi.py"
