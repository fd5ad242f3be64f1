"""The environment SDK stays torch-free with its adapters in use: a fresh interpreter imports
``gspo_rl.client``, every module under ``clients/adapters/`` (found in the tree, so a new
adapter is covered), every third-party module those modules import (at module level or inside
a function: the adapters' libraries, ``verifiers.v1``, ``reasoning_gym``, ``openenv``, loaded
lazily when an adapter is used), the built-in examples through the loader, and loads a
reasoning-gym and a verifiers environment (a taskset of the test suite's); then neither torch
nor transformers (nor vLLM) is loaded. The package graph check (``test_import_graph``) covers
the SDK's own import statements; this one covers what its libraries pull in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.checks.test_import_graph import imported_modules

REPO = Path(__file__).resolve().parents[2]
ADAPTERS = REPO / "clients" / "adapters"
VF_MATH = REPO / "tests" / "clients" / "adapters" / "verifiers_envs" / "gspo_vf_math"
HEAVY = ("torch", "transformers", "vllm")

_PROBE = """
import importlib, json, sys
import gspo_rl.client
from gspo_rl.client.loading import BUILTIN, load_environment
modules, specs = json.loads(sys.argv[1])
for name in modules:
    importlib.import_module(name)
envs = [type(load_environment(name, 2)).__name__ for name in BUILTIN]
envs += [type(load_environment(spec, 2, args)).__name__ for spec, args in specs]
heavy = sorted({k.split(".")[0] for k in sys.modules} & set(sys.argv[2:]))
print(json.dumps({"envs": envs, "heavy": heavy}))
"""


def adapter_modules() -> list[str]:
    """``gspo_rl.client.adapters...`` for every module file under ``clients/adapters/``."""
    out = []
    for path in sorted(ADAPTERS.rglob("*.py")):
        parts = path.relative_to(ADAPTERS).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        out.append(".".join(["gspo_rl.client.adapters", *parts]))
    return out


def libraries_imported() -> list[str]:
    """The third-party modules the adapters import anywhere (not the standard library, not
    the project's own)."""
    found = {module for path in ADAPTERS.rglob("*.py") for _, module in imported_modules(path)}
    return sorted(m for m in found if m.split(".")[0] not in sys.stdlib_module_names
                  and m.split(".")[0] not in ("gspo_rl", "__future__"))


def test_the_adapters_and_their_libraries_are_all_found() -> None:
    modules = adapter_modules()
    for name in ("gspo_rl.client.adapters", "gspo_rl.client.adapters.reasoning_gym",
                 "gspo_rl.client.adapters.verifiers.hooks",
                 "gspo_rl.client.adapters.openenv.environment"):
        assert name in modules
    tops = {m.split(".")[0] for m in libraries_imported()}
    assert {"verifiers", "reasoning_gym", "openenv"} <= tops, tops


def test_the_sdk_with_its_adapters_in_use_loads_no_torch() -> None:
    modules = ["gspo_rl.client", *adapter_modules(), *libraries_imported()]
    specs = [("reasoning-gym:leg_counting", {"size": 20}),
             (f"verifiers:{VF_MATH}", {"harness": "null"})]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as once installed
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps([modules, specs]), *HEAVY],
                         cwd=REPO.parent, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["heavy"] == [], f"the SDK's adapters loaded {report['heavy']}"
    assert report["envs"][-2:] == ["ReasoningGymEnvironment", "VerifiersEnvironment"]
    assert len(report["envs"]) >= 6  # the built-in examples too
