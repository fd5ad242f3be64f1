"""The package graph (docs/ARCHITECTURE.md): who may import whom.

Every package is installed under one namespace, ``gspo_rl`` (setup.py maps the top-level
folders into it), and no module imports a folder by its bare name (``server``, ``clients``):
that would work from a checkout and fail once installed. ``gspo_rl.contract`` (the wire
contract) imports no other package of the project; ``gspo_rl.redisq`` (its Redis
implementation) imports the contract only; ``gspo_rl.server`` and ``gspo_rl.learner`` import
both and never each other; ``gspo_rl.client`` (the environment SDK) imports none of them and no
torch; the CLI (``gspo_rl`` itself, from ``gspo/``) may import everything. Inside a package,
the wings depend one way (``LAYERS``): the server's HTTP layer on the rollout layer, that on the
engines and the config; the learner's top-level modules (the process) on its components, and
components never on the process; the Redis stores on the ready stream, that on the scripts'
plumbing. No import cycle anywhere. Checked twice: statically, over every import statement of
every module (fast, and it names the file and line), and in a fresh interpreter, over what
importing one side actually loads into ``sys.modules`` (catches an import hidden behind a
dynamic ``importlib`` call or a package ``__init__``).
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

FOLDER = {"gspo_rl.contract": "contract", "gspo_rl.redisq": "redisq", "gspo_rl.server": "server",
          "gspo_rl.learner": "learner", "gspo_rl.client": "clients", "gspo_rl": "gspo"}
BARE = {"contract", "redisq", "server", "learner", "clients", "gspo"}  # the folders' own names

# package -> packages it must never import (at module level or inside a function)
FORBIDDEN: dict[str, set[str]] = {
    "gspo_rl.contract": {"gspo_rl.redisq", "gspo_rl.server", "gspo_rl.learner", "gspo_rl.client",
                         "gspo_rl.cli"},
    "gspo_rl.redisq": {"gspo_rl.server", "gspo_rl.learner", "gspo_rl.client", "gspo_rl.cli"},
    "gspo_rl.server": {"gspo_rl.learner", "gspo_rl.client", "gspo_rl.cli"},
    "gspo_rl.learner": {"gspo_rl.server", "gspo_rl.client", "gspo_rl.cli"},
    "gspo_rl.client": {"torch", "gspo_rl.contract", "gspo_rl.redisq", "gspo_rl.server",
                       "gspo_rl.learner", "gspo_rl.cli"},
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


# package -> rank of each part (a sub-package, or a top-level module as "module.py"; "*.py":
# every top-level module not named). A module may import parts of a lower rank and its own
# part, never a part of the same or a higher rank.
LAYERS: dict[str, dict[str, int]] = {
    "gspo_rl.server": {"api": 5, "run.py": 4, "rollouts": 3, "metrics.py": 2, "engines": 1,
                       "config.py": 0, "__init__.py": 0},
    "gspo_rl.learner": {"sft": 10, "*.py": 9, "runtime": 4, "config.py": 3, "parallel": 2,
                        "algorithm": 2, "checkpoint": 2, "model": 1, "weights": 1,
                        "tracking": 1, "data": 0},
    "gspo_rl.contract": {"weights": 1, "chat": 1, "*.py": 0},
    "gspo_rl.redisq": {"episodes": 3, "groups": 2, "ready": 1, "*.py": 0},
}


def part_of(package: str, module: str) -> str | None:
    """The part of ``package`` (a key of ``LAYERS[package]``) that ``module`` belongs to."""
    if not is_in(module, package) or module == package:
        return None
    head = module[len(package) + 1:].split(".")[0]
    folder = REPO / FOLDER[package]
    if (folder / head).is_dir():
        return head
    name = f"{head}.py"
    return name if name in LAYERS[package] else "*.py"


def layer_violations(package: str) -> list[str]:
    ranks = LAYERS[package]
    found = []
    folder = REPO / FOLDER[package]
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder)
        me = rel.parts[0] if len(rel.parts) > 1 else (
            rel.name if rel.name in ranks else "*.py")
        for line, module in imported_modules(path):
            other = part_of(package, module)
            if other is not None and other != me and ranks[other] >= ranks[me]:
                found.append(f"{path.relative_to(REPO)}:{line} ({me}) imports {module} ({other})")
    return found


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_wings_depend_one_way(package: str) -> None:
    assert layer_violations(package) == []


# Below the server's HTTP layer nothing knows HTTP: domain code raises domain errors, which
# gspo_rl.server.api.errors maps to statuses in one place.
HTTP_FREE = ("server/rollouts", "server/engines", "server/config.py", "server/metrics.py",
             "contract", "redisq", "learner")


def test_nothing_below_the_http_layer_imports_an_http_framework() -> None:
    found = [f"{path.relative_to(REPO)}:{line} imports {module}"
             for place in HTTP_FREE
             for path in ([REPO / place] if place.endswith(".py")
                          else sorted((REPO / place).rglob("*.py")))
             for line, module in imported_modules(path)
             if module.split(".")[0] in ("fastapi", "starlette")]
    assert found == []


def module_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (a package's ``__init__`` as the package)."""
    names: dict[Path, str] = {}
    for package, folder in FOLDER.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names[path] = ".".join([package, *parts])
    known = set(names.values())
    graph: dict[str, set[str]] = {}
    for path, name in names.items():
        out = set()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                subs = {f"{node.module}.{a.name}" for a in node.names} & known
                out |= subs or ({node.module} & known)
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names} & known
        graph[name] = out - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle() -> None:
    assert cycles(module_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


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
    assert loaded_by("gspo_rl.learner") == {"gspo_rl.learner", "gspo_rl.redisq",
                                            "gspo_rl.contract", "torch"}


def test_importing_the_server_loads_no_learner_module() -> None:
    assert loaded_by("gspo_rl.server") == {"gspo_rl.server", "gspo_rl.redisq",
                                           "gspo_rl.contract", "torch"}


def test_importing_the_contract_loads_neither_side() -> None:
    assert loaded_by("gspo_rl.contract") == {"gspo_rl.contract", "torch"}


def test_importing_the_redis_implementation_loads_the_contract_only() -> None:
    assert loaded_by("gspo_rl.redisq") == {"gspo_rl.redisq", "gspo_rl.contract"}


def test_importing_the_sdk_loads_no_torch_and_neither_side() -> None:
    assert loaded_by("gspo_rl.client") == {"gspo_rl.client"}
