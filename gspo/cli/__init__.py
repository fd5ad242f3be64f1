"""The ``gspo`` command (``app``): thin, it parses arguments, then imports what it runs."""

from gspo_rl.cli.app import app

__all__ = ["app"]
