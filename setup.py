"""Installs the repository's top-level folders as one namespace, ``gspo_rl``.

The folders stay where the product's layout puts them (``server/``, ``learner/``, ...); in
site-packages they are ``gspo_rl.server``, ``gspo_rl.learner``, ``gspo_rl.contract``,
``gspo_rl.redisq`` (the Redis implementation of the contract), ``gspo_rl.client`` (the
environment SDK, from ``clients/``) and ``gspo_rl`` itself (the CLI, from ``gspo/``), so
that no generic name (``server``, ``clients``) lands at the top of a user's environment.
Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = {
    "gspo_rl": "gspo",
    "gspo_rl.contract": "contract",
    "gspo_rl.redisq": "redisq",
    "gspo_rl.server": "server",
    "gspo_rl.learner": "learner",
    "gspo_rl.client": "clients",
}


def packages() -> list[str]:
    out = []
    for name, folder in FOLDERS.items():
        out += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]
    return out


# The SDK's example data (tasks from data: clients/examples/math, scripts/make_math_problems.py)
# and the servers' dashboard page (HTML, CSS, JS: served from the package, no CDN).
PACKAGE_DATA = {"gspo_rl.client.examples": ["math/*.jsonl", "math/*.toml"],
                "gspo_rl.server.api.dashboard": ["static/*"]}

setup(package_dir=FOLDERS, packages=packages(), package_data=PACKAGE_DATA)
