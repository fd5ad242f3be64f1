"""The command-line options and the model that the serving benchmarks (``bench_server``,
``bench_streaming``) share: a tiny model made on the spot unless ``--model`` names one."""

from __future__ import annotations

import argparse
from pathlib import Path


def serving_parser(doc: str, *, max_tokens: int, concurrency: int) -> argparse.ArgumentParser:
    """A parser with the options both serving benchmarks take; each adds its own."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="model dir (default: a fresh tiny model)")
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=concurrency)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the model's dtype, the same both ways (the server's own default on a "
                        "GPU is bfloat16)")
    p.add_argument("--layers", type=int, default=2, help="tiny model's layers")
    p.add_argument("--hidden", type=int, default=128, help="tiny model's hidden size")
    return p


def model_dir(args: argparse.Namespace, tmp: Path) -> Path:
    """``--model``, or a tiny model of ``--layers`` x ``--hidden`` made under ``tmp``."""
    if args.model is not None:
        return Path(args.model)
    from gspo_rl.tiny_model import make_tiny_model

    return make_tiny_model(tmp / "tiny", num_layers=args.layers, hidden_size=args.hidden)
