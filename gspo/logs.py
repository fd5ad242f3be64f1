"""Logging of the ``gspo`` processes (serve, learn, sft, the Python API's child): one format,
the per-request INFO lines of HTTP client libraries silenced (httpx logs two per learner step,
most of a run's log), and the settings a process starts with dumped once at INFO, secrets
hidden (``SecretStr`` fields and the password of any URL), so that a log says what ran."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
QUIET = ("httpx", "httpcore", "urllib3")
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/:@\s]*:)[^@/\s]+@")


def configure_logging(level: str | int = "INFO") -> None:
    """The root logger at ``level`` with ``LOG_FORMAT``; the HTTP client libraries at
    WARNING (their failures still show), unless ``level`` is DEBUG (then everything)."""
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    logging.basicConfig(level=numeric, format=LOG_FORMAT)
    for name in QUIET:
        logging.getLogger(name).setLevel(
            numeric if int(numeric) <= logging.DEBUG else max(logging.WARNING, int(numeric)))


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\g<head>***@", text)


def config_dump(config: Any) -> str:
    """A pydantic model's settings as one JSON line (``SecretStr`` fields masked by pydantic,
    URL passwords by ``redact``)."""
    return redact(json.dumps(config.model_dump(mode="json"), sort_keys=True, default=str))


def log_config(what: str, config: Any) -> None:
    logging.getLogger("gspo_rl.config").info("%s config: %s", what, config_dump(config))
