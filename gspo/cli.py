"""The `gspo` command. Thin: parses arguments, then imports the heavy modules it needs."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="gspo",
    help="gspo-rl: asynchronous GSPO reinforcement learning for language models.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def version() -> None:
    """Print the installed version."""
    from gspo import __version__

    typer.echo(__version__)


if __name__ == "__main__":
    app()
