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


@app.command("tiny-model")
def tiny_model(
    path: str = typer.Argument(..., help="Directory to write the model to."),
    seed: int = typer.Option(0, help="Seed of the random weights (same seed, same bytes)."),
    tied: bool = typer.Option(True, "--tied/--untied", help="Tie input and output embeddings."),
    layers: int = typer.Option(2, help="Number of transformer layers."),
    hidden: int = typer.Option(128, help="Hidden size (a multiple of the head dimension 64)."),
    vocab_size: int = typer.Option(1024, help="Vocabulary size of model and tokenizer."),
) -> None:
    """Write a tiny random Qwen2 model (config, tokenizer, weights) made locally."""
    from server.tiny_model import make_tiny_model

    out = make_tiny_model(
        path, seed=seed, tie_embeddings=tied, num_layers=layers, hidden_size=hidden,
        vocab_size=vocab_size,
    )
    typer.echo(str(out))


if __name__ == "__main__":
    app()
