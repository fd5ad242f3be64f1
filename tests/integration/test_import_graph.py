"""The package graph (docs/ARCHITECTURE.md): who may import whom.

``contract`` (the wire contract) imports no other package of the project; ``server`` and
``learner`` import ``contract`` and never each other; ``clients`` (the environment SDK) imports
none of them and no torch; ``gspo`` (the CLI) may import everything. Checked twice: statically,
over every import statement of every module (fast, and it names the file and line), and in a
fresh interpreter, over what importing one side actually loads into ``sys.modules`` (catches an
import hidden behind a dynamic ``importlib`` call or a package ``__init__``).
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

# package -> top-level modules it must never import (at module level or inside a function)
FORBIDDEN: dict[str, set[str]] = {
    "contract": {"server", "learner", "gspo", "clients"},
    "server": {"learner", "gspo", "clients"},
    "learner": {"server", "gspo", "clients"},
    "clients": {"torch", "contract", "server", "learner", "gspo"},
}


def imported_tops(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every absolute import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def violations(package: str) -> list[str]:
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        for line, top in imported_tops(path):
            if top in FORBIDDEN[package]:
                found.append(f"{path.relative_to(REPO)}:{line} imports {top}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_forbidden_import_statement(package: str) -> None:
    assert (REPO / package / "__init__.py").exists()
    assert violations(package) == []


def test_the_static_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import os\n\ndef f():\n"
                   "    from server.store import X\n    import learner.loop\n")
    assert imported_tops(src) == [(1, "os"), (4, "server"), (5, "learner")]


# Imports every module of the named packages (the vLLM engine's modules need vllm: left out,
# the static check covers them) and prints which project packages and torch got loaded.
_PROBE = """
import importlib, json, pkgutil, sys
for name in sys.argv[1:]:
    pkg = importlib.import_module(name)
    for m in pkgutil.walk_packages(pkg.__path__, name + "."):
        if "vllm" not in m.name:
            importlib.import_module(m.name)
tops = {"contract", "server", "learner", "clients", "gspo", "torch"}
print(json.dumps(sorted({k.split(".")[0] for k in sys.modules} & tops)))
"""


def loaded_by(*packages: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", _PROBE, *packages], cwd=REPO, check=True,
                         capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_importing_the_learner_loads_no_server_module() -> None:
    assert loaded_by("learner") == {"learner", "contract", "torch"}


def test_importing_the_server_loads_no_learner_module() -> None:
    assert loaded_by("server") == {"server", "contract", "torch"}


def test_importing_the_contract_loads_neither_side() -> None:
    assert loaded_by("contract") == {"contract", "torch"}


def test_importing_the_sdk_loads_no_torch_and_neither_side() -> None:
    assert loaded_by("clients") == {"clients"}
