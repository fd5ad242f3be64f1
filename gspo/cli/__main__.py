"""``python -m gspo_rl.cli``: the ``gspo`` command (torchrun and the tests start it so)."""

from gspo_rl.cli.app import app

app()
