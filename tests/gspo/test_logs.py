"""gspo_rl.logs: HTTP client libraries kept at WARNING, settings dumped with secrets hidden."""

from __future__ import annotations

import logging

import pytest

from gspo_rl.learner.config import LearnerConfig
from gspo_rl.logs import config_dump, configure_logging, redact


def test_redact_hides_url_passwords_only() -> None:
    assert redact("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact("x http://u:p@h/ y") == "x http://u:***@h/ y"
    assert redact("redis://h:6379/0 and u@example.org") == "redis://h:6379/0 and u@example.org"


def test_dump_hides_secrets() -> None:
    cfg = LearnerConfig(model="m", redis_url="redis://:hunter2@redis:6379/0",
                        admin_key="sekrit")
    dump = config_dump(cfg)
    assert "hunter2" not in dump and "sekrit" not in dump
    assert '"admin_key": "**********"' in dump and '"redis_url": "redis://:***@redis' in dump


def test_httpx_info_is_silenced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    configure_logging("info")
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("gspo_rl.learner").getEffectiveLevel() == logging.INFO
    configure_logging("debug")
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.DEBUG
