"""gspo-rl: the `gspo` command line."""

__version__ = "0.1.0"
