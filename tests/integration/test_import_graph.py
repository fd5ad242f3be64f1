"""The package graph (docs/ARCHITECTURE.md): who may import whom.

Every package is installed under one namespace, ``gspo_rl`` (setup.py maps the top-level
folders into it), and no module imports a folder by its bare name (``server``, ``clients``):
that would work from a checkout and fail once installed. ``gspo_rl.contract`` (the wire
contract) imports no other package of the project; ``gspo_rl.server`` and ``gspo_rl.learner``
import the contract and never each other; ``gspo_rl.client`` (the environment SDK) imports none
of them and no torch; the CLI (``gspo_rl`` itself, from ``gspo/``) may import everything.
Checked twice: statically, over every import statement of every module (fast, and it names the
file and line), and in a fresh interpreter, over what importing one side actually loads into
``sys.modules`` (catches an import hidden behind a dynamic ``importlib`` call or a package
``__init__``).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FOLDER = {"gspo_rl.contract": "contract", "gspo_rl.server": "server",
          "gspo_rl.learner": "learner", "gspo_rl.client": "clients", "gspo_rl": "gspo"}
BARE = {"contract", "server", "learner", "clients", "gspo"}  # the folders' own names

# package -> packages it must never import (at module level or inside a function)
FORBIDDEN: dict[str, set[str]] = {
    "gspo_rl.contract": {"gspo_rl.server", "gspo_rl.learner", "gspo_rl.client", "gspo_rl.cli"},
    "gspo_rl.server": {"gspo_rl.learner", "gspo_rl.client", "gspo_rl.cli"},
    "gspo_rl.learner": {"gspo_rl.server", "gspo_rl.client", "gspo_rl.cli"},
    "gspo_rl.client": {"torch", "gspo_rl.contract", "gspo_rl.server", "gspo_rl.learner",
                       "gspo_rl.cli"},
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def is_in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(package: str) -> list[str]:
    found = []
    for path in sorted((REPO / FOLDER[package]).rglob("*.py")):
        for line, module in imported_modules(path):
            if any(is_in(module, p) for p in FORBIDDEN[package]):
                found.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_forbidden_import_statement(package: str) -> None:
    assert (REPO / FOLDER[package] / "__init__.py").exists()
    assert violations(package) == []


def test_nothing_imports_a_folder_by_its_bare_name() -> None:
    found = [f"{path.relative_to(REPO)}:{line} imports {module}"
             for folder in (*FOLDER.values(), "tests", "benchmarks", "scripts")
             for path in sorted((REPO / folder).rglob("*.py"))
             for line, module in imported_modules(path)
             if module.split(".")[0] in BARE]
    assert found == []


def test_the_static_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import os\n\ndef f():\n"
                   "    from gspo_rl.server.api.app import X\n    import gspo_rl.learner.loop\n")
    assert imported_modules(src) == [(1, "os"), (4, "gspo_rl.server.api.app"),
                                     (5, "gspo_rl.learner.loop")]
    assert is_in("gspo_rl.server.api.app", "gspo_rl.server")
    assert not is_in("gspo_rl.serverless", "gspo_rl.server")


# Imports every module of the named packages (the vLLM engine's modules need vllm: left out,
# the static check covers them) and prints which project packages and torch got loaded.
_PROBE = """
import importlib, json, pkgutil, sys
for name in sys.argv[1:]:
    pkg = importlib.import_module(name)
    for m in pkgutil.walk_packages(pkg.__path__, name + "."):
        if "vllm" not in m.name:
            importlib.import_module(m.name)
def part(k):
    if k.split(".")[0] == "torch":
        return "torch"
    if k.startswith("gspo_rl."):
        return ".".join(k.split(".")[:2])
print(json.dumps(sorted({part(k) for k in sys.modules} - {None})))
"""


def loaded_by(*packages: str) -> set[str]:
    # From outside the checkout, as an installed environment sees it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", _PROBE, *packages], cwd=REPO.parent,
                         check=True, capture_output=True, text=True, timeout=240, env=env)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_importing_the_learner_loads_no_server_module() -> None:
    assert loaded_by("gspo_rl.learner") == {"gspo_rl.learner", "gspo_rl.contract", "torch"}


def test_importing_the_server_loads_no_learner_module() -> None:
    assert loaded_by("gspo_rl.server") == {"gspo_rl.server", "gspo_rl.contract", "torch"}


def test_importing_the_contract_loads_neither_side() -> None:
    assert loaded_by("gspo_rl.contract") == {"gspo_rl.contract", "torch"}


def test_importing_the_sdk_loads_no_torch_and_neither_side() -> None:
    assert loaded_by("gspo_rl.client") == {"gspo_rl.client"}
