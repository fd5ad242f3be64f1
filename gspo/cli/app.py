"""The `gspo` command. Thin: parses arguments, then imports the heavy modules it needs. The
commands that run a process from a config (serve, learn, sft, up) are ``gspo_rl.cli.runs``;
the others are here."""

from __future__ import annotations

import inspect

import typer

from gspo_rl.cli.options import config_option, parameters, with_parameters
from gspo_rl.cli.panels import panel_command
from gspo_rl.cli.runs import learn, serve, sft, up

app = typer.Typer(
    name="gspo",
    help="gspo-rl: asynchronous GSPO reinforcement learning for language models.",
    no_args_is_help=True,
    add_completion=False,
    # click's plain help: wrapped to the terminal, never cut (rich's tables cut long flag
    # names and words with an ellipsis at 80 columns)
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
)


def _print_version(value: bool) -> None:
    if value:
        from gspo_rl import __version__

        typer.echo(f"gspo-rl {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the installed version and exit."),
) -> None:
    """gspo-rl: asynchronous GSPO reinforcement learning for language models."""


@app.command(short_help="Print the installed version.")
def version() -> None:
    """Print the installed version."""
    from gspo_rl import __version__

    typer.echo(__version__)


@app.command("tiny-model", short_help="Write a tiny random model (no download).")
def tiny_model(
    path: str = typer.Argument(..., help="Directory to write the model to."),
    seed: int = typer.Option(0, help="Seed of the random weights (same seed, same bytes)."),
    tied: bool = typer.Option(True, "--tied/--untied", help="Tie input and output embeddings."),
    layers: int = typer.Option(2, help="Number of transformer layers."),
    hidden: int = typer.Option(128, help="Hidden size (a multiple of the head dimension 64)."),
    vocab_size: int = typer.Option(1024, help="Vocabulary size of model and tokenizer."),
) -> None:
    """Write a tiny random Qwen2 model (config, tokenizer, weights) made locally."""
    from gspo_rl.tiny_model import make_tiny_model

    out = make_tiny_model(
        path, seed=seed, tie_embeddings=tied, num_layers=layers, hidden_size=hidden,
        vocab_size=vocab_size,
    )
    typer.echo(str(out))


# Not fields: --vllm-arg (parsed into ServerSettings.vllm_args), uvicorn's log level.
_VLLM_ARG = inspect.Parameter(
    "vllm_arg", inspect.Parameter.KEYWORD_ONLY, annotation=list[str],
    default=typer.Option(None, "--vllm-arg", help="vLLM: any other engine argument as "
                         "key=value (value parsed as JSON when it is JSON), repeatable: "
                         "--vllm-arg swap_space=8."))
_SERVE_LOG_LEVEL = inspect.Parameter("log_level", inspect.Parameter.KEYWORD_ONLY, annotation=str,
                                     default=typer.Option("info", help="uvicorn log level."))
_SERVE_CONFIG = config_option("TOML file of server settings "
                         "(ServerSettings fields, [queue] for its own); GSPO_* env vars and "
                         "flags override it.")
app.command(short_help="Run the rollout server (HTTP API + engine).",
            cls=panel_command("serve", "serve_after_vllm_arg",
                                vllm_arg="model and engine"))(with_parameters(
    serve, [_SERVE_CONFIG, *parameters("serve"), _VLLM_ARG,
            *parameters("serve_after_vllm_arg"), _SERVE_LOG_LEVEL]))


_CONFIG = config_option("TOML file of learner settings (LearnerConfig "
                         "fields); flags override it.")
_LEARN_LOG_LEVEL = inspect.Parameter("log_level", inspect.Parameter.KEYWORD_ONLY, annotation=str,
                                     default=typer.Option("info", help="Python logging level."))
app.command(short_help="Run the learner: train on groups from Redis.",
            cls=panel_command("learn"))(with_parameters(
    learn, [_CONFIG, *parameters("learn"), _LEARN_LOG_LEVEL]))


_SFT_CONFIG = config_option("TOML file of SFTConfig fields; flags "
                         "override it.")
app.command(short_help="Supervised warm start on chat demonstrations.",
            cls=panel_command("sft"))(with_parameters(
    sft, [_SFT_CONFIG, *parameters("sft"), _LEARN_LOG_LEVEL]))


@app.command(short_help="Run an environment against a rollout server.")
def env(
    names: list[str] = typer.Argument(None, metavar="[SPEC[@WEIGHT]]...",
                                      help="Environment(s), side by side by weight: "
                                      "alphabet (default) | calculator | long_letters | "
                                      "alphabet_dialogue | "
                                      "path/to/module.py:Cls "
                                      "| package.module:Cls | verifiers:MODULE | "
                                      "reasoning-gym:NAME,... | openenv:URL | "
                                      "textarena:GAME_ID | tasks.toml "
                                      "(tasks from data) | data (with --data)."),
    env_arg: list[str] = typer.Option(None, "--env-arg", help="An environment's argument, "
                                      "key=value (JSON value; dotted keys nest), repeatable; "
                                      "NAME:key=value with several environments."),
    url: str = typer.Option("http://127.0.0.1:8000", envvar="GSPO_SERVER_URL",
                            help="Rollout server base URL. (env GSPO_SERVER_URL)"),
    groups: int = typer.Option(0, help="Groups to run; 0 runs until stopped."),
    group_size: int = typer.Option(None, help="Samples (episodes) per group. (default: the "
                                   "environment's own; 8 for the examples)"),
    concurrency: int = typer.Option(4, help="Groups run at the same time."),
    seed: int = typer.Option(0, help="Seed of the task sampler."),
    on_error: str = typer.Option("retry", help="A failed group: retry | abandon | raise."),
    max_retries: int = typer.Option(1, help="Retries of a failed group's task (retry)."),
    data: list[str] = typer.Option(None, help="Tasks from data: a JSONL, JSON or Parquet "
                                   "file, or a datasets directory (repeatable)."),
    verifier: str = typer.Option(None, help="With --data: exact | normalized | numeric | "
                                 "math | regex | json_schema | python. (default: exact)"),
    eval_data: list[str] = typer.Option(None, help="An eval set (repeatable): run every "
                                        "--eval-every policy versions, unrecorded."),
    eval_every: int = typer.Option(None, help="Evaluate every this many policy versions "
                                   "(default: the task file's, else 10)."),
    eval_out: str = typer.Option(None, help="Append each evaluation's metrics to this JSONL "
                                 "file."),
    evaluate: bool = typer.Option(True, "--eval/--no-eval", help="Run the eval set, if "
                                  "there is one."),
    out: str = typer.Option(None, help="Append every finished group (task, rewards, "
                            "transcripts) to this JSONL file."),
    summary_every: float = typer.Option(10.0, help="Seconds between live summary lines."),
    target_reward: float = typer.Option(None, help="Start no new group once the last 32 "
                                        "average this reward (the task is learned); 0 or "
                                        "unset: never."),
) -> None:
    """Run an environment against a rollout server (reads env GSPO_API_KEY)."""
    from gspo_rl.cli.env_run import EnvRun, EnvRunError, run_env

    try:
        lines = run_env(EnvRun(
            names=list(names or ["alphabet"]), env_args=list(env_arg or []), url=url,
            groups=groups, group_size=group_size, concurrency=concurrency,
            seed=seed, on_error=on_error, max_retries=max_retries, data=list(data or []),
            verifier=verifier, eval_data=list(eval_data or []), eval_every=eval_every,
            eval_out=eval_out, evaluate=evaluate, out=out, summary_every_s=summary_every,
            target_reward=target_reward))
    except EnvRunError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(exc.code) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    for line in lines:
        typer.echo(line)


_UP_CONFIG = config_option("TOML file of UpConfig fields (these flags' "
                         "names with underscores, env_args for --env-arg; docs/reference/"
                         "configuration.md); flags override it.")
app.command(short_help="Redis, server, learner and environment: train, plot.",
            cls=panel_command("up"))(with_parameters(up, [_UP_CONFIG, *parameters("up")]))


@app.command("export", short_help="Write a checkpoint as a merged Hugging Face model.")
def export(
    checkpoint: str = typer.Option(..., help="A learner checkpoint directory (step-N): a LoRA "
                                   "adapter or full weights."),
    out: str = typer.Option(..., help="New directory for the merged Hugging Face model."),
) -> None:
    """Write a checkpoint as a plain Hugging Face model (LoRA merged into its base)."""
    from gspo_rl.learner.checkpoint.export import export_merged

    try:
        path = export_merged(checkpoint, out)
    except (ValueError, OSError) as exc:
        typer.echo(f"gspo export: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(str(path))


@app.command("eval", short_help="Evaluate a checkpoint or a running server.")
def eval_(
    tasks: str = typer.Argument(None, help="A task file: its eval set (else its sources, "
                                "each task once)."),
    data: list[str] = typer.Option(None, help="The eval set's data files instead."),
    verifier: str = typer.Option(None, help="With --data: the verifier (default: exact)."),
    model: str = typer.Option(None, help="A model directory or a learner's save directory "
                              "(its newest checkpoint): a server is started on it."),
    url: str = typer.Option(None, help="A running rollout server instead (reads env "
                            "GSPO_API_KEY)."),
    samples: int = typer.Option(None, help="Answers per task (default: the eval set's, 4)."),
    k: list[int] = typer.Option(None, help="pass@k for this k (repeatable; default: 1 and "
                                "--samples)."),
    temperature: float = typer.Option(None, help="Sampling temperature (0: greedy)."),
    max_tokens: int = typer.Option(None, help="Tokens per answer."),
    limit: int = typer.Option(None, help="Evaluate only the first N tasks."),
    out: str = typer.Option("eval_report.json", help="Where the JSON report goes."),
    post: bool = typer.Option(False, "--post/--no-post", help="With --url: also post the "
                              "result (POST /v1/evals) for the learner to log."),
    device: str = typer.Option(None, help="With --model: the server's device."),
) -> None:
    """Evaluate a checkpoint or a running server on an eval set: pass@k, mean reward."""
    from pathlib import Path

    from gspo_rl.cli.tasks import TaskConfigError
    from gspo_rl.launch.evaluate import EvalRun, run_eval

    try:
        report = run_eval(EvalRun(tasks=tasks, data=list(data or []), verifier=verifier,
                                  model=model, url=url, samples=samples, k=list(k or []),
                                  temperature=temperature, max_tokens=max_tokens, limit=limit,
                                  post=post, device=device))
    except TaskConfigError as exc:
        typer.echo(f"gspo eval: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(report.line())
    for name, value in report.metrics.items():
        if "/" in name:
            typer.echo(f"  {name} {value:.3f}")
    typer.echo(f"report: {report.write(Path(out))}")
