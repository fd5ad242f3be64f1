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


@app.command()
def serve(
    model: str = typer.Option(None, help="Model directory to serve. (env GSPO_MODEL)"),
    engine: str = typer.Option(None, help="Inference engine: hf | vllm. (default: hf)"),
    served_model_name: str = typer.Option(None, help="Name clients send as `model` "
                                          "(default: the model directory's name)."),
    host: str = typer.Option(None, help="Interface to bind. (default: 127.0.0.1)"),
    port: int = typer.Option(None, help="TCP port. (default: 8000)"),
    redis_url: str = typer.Option(None, help="Redis URL. (default: redis://127.0.0.1:6379/0)"),
    key_prefix: str = typer.Option(None, help="Prefix of every Redis key. (default: gspo)"),
    api_key: str = typer.Option(None, help="Bearer key of the /v1 routes (prefer the env var "
                                "GSPO_API_KEY: flags show in `ps`)."),
    admin_key: str = typer.Option(None, help="Bearer key of the admin (weight) routes; must "
                                  "differ from the API key. (env GSPO_ADMIN_KEY)"),
    device: str = typer.Option(None, help="Torch device of the hf engine (cpu, cuda, ...)."),
    max_batch_size: int = typer.Option(None, help="Most sequences decoded together."),
    max_n: int = typer.Option(None, help="Most samples per request."),
    max_tokens: int = typer.Option(None, help="Most generated tokens per sample."),
    max_body_bytes: int = typer.Option(None, help="Largest accepted request body."),
    group_ttl_s: float = typer.Option(None, help="Seconds a group waits for its rewards."),
    server_id: str = typer.Option(None, help="Id in the Redis server registry."),
    advertise_url: str = typer.Option(None, help="URL the learner reaches this server at."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
) -> None:
    """Run the rollout server (HTTP API + engine). Unset flags fall back to GSPO_* env vars."""
    flags = {k: v for k, v in locals().items() if v is not None and k not in
             ("log_level", "group_ttl_s")}
    if group_ttl_s is not None:
        flags["queue"] = {"group_ttl_s": group_ttl_s}
    from pydantic import ValidationError

    from server.settings import ServerSettings

    try:
        settings = ServerSettings(**flags)
    except ValidationError as exc:
        # Not str(exc): it would echo the input values, keys included.
        lines = [f"  {'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}"
                 for e in exc.errors()]
        typer.echo("invalid server settings:\n" + "\n".join(lines), err=True)
        raise typer.Exit(2) from exc
    import uvicorn

    from server.app import create_app

    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level=log_level, timeout_graceful_shutdown=30)


if __name__ == "__main__":
    app()
