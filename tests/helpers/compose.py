"""Reading docker-compose.yml the way `docker compose` does, without a Docker engine.

No Docker engine is needed by the test suite, so tests/deploy/test_compose.py checks the
file by parsing it: ``${VAR}`` interpolation from a dotenv file (the Compose Specification's rules),
short and long volume syntax, profiles, and the ``gspo`` command line inside each service.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
SCHEMA_FILE = REPO / "tests" / "data" / "compose-spec.json"

# $$ (a literal $), ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error},
# ${NAME:+alt}, ${NAME+alt}, $NAME.
_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)
_SHELL_OPERATORS = {"||", "&&", ";", "|", "&", "(", ")"}


class MissingVariable(ValueError):
    """A ``${VAR:?message}`` whose variable is unset (or empty): compose refuses the file."""


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose file as YAML data (anchors and ``<<`` merge keys resolved, as compose does)."""
    with open(path) as f:
        doc = yaml.safe_load(f)
    assert isinstance(doc, dict), f"{path} is not a mapping"
    return doc


def parse_dotenv(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of a dotenv file: comments, blank lines, ``export``, quotes."""
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            raise ValueError(f"line {n} is not KEY=VALUE: {raw!r}")
        value = value.strip()
        if value[:1] in ("'", '"') and value.endswith(value[0]) and len(value) >= 2:
            value = value[1:-1]
        else:
            value = re.split(r"\s+#", value, maxsplit=1)[0]
        out[key.strip()] = value
    return out


def _strings(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return []


def referenced_variables(obj: Any) -> set[str]:
    """Every variable name a ``$`` reference anywhere in ``obj`` (keys excluded) names."""
    names = set()
    for s in _strings(obj):
        for m in _VAR.finditer(s):
            if not m.group("escaped"):
                names.add(m.group("braced") or m.group("plain"))
    return names


def _substitute(m: re.Match[str], env: dict[str, str]) -> str:
    if m.group("escaped"):
        return "$"
    name = m.group("braced") or m.group("plain")
    op, arg = m.group("op"), m.group("arg") or ""
    value = env.get(name)
    is_set, is_nonempty = value is not None, bool(value)
    present = is_nonempty if op and op.startswith(":") else is_set
    if op in ("-", ":-"):
        return value if present else arg  # type: ignore[return-value]
    if op in ("?", ":?"):
        if not present:
            raise MissingVariable(f"{name}: {arg}")
        return value  # type: ignore[return-value]
    if op in ("+", ":+"):
        return arg if present else ""
    return value or ""


def interpolate(obj: Any, env: dict[str, str]) -> Any:
    """``obj`` with every string interpolated from ``env`` (raises ``MissingVariable``)."""
    if isinstance(obj, str):
        return _VAR.sub(lambda m: _substitute(m, env), obj)
    if isinstance(obj, dict):
        return {k: interpolate(v, env) for k, v in obj.items()}
    if isinstance(obj, list):
        return [interpolate(v, env) for v in obj]
    return obj


def required_variable(value: Any) -> str | None:
    """The variable of a value that is exactly ``${VAR:?...}`` (a required variable), else None."""
    if not isinstance(value, str):
        return None
    m = _VAR.fullmatch(value)
    return m.group("braced") if m and m.group("op") == ":?" else None


def services_in(doc: dict[str, Any], profile: str) -> dict[str, dict[str, Any]]:
    """The services ``docker compose --profile PROFILE up`` starts (no profiles: always)."""
    return {name: svc for name, svc in doc["services"].items()
            if not svc.get("profiles") or profile in svc["profiles"]}


def gspo_argv(command: Any) -> list[str] | None:
    """The arguments after ``gspo`` of a service's command, also inside ``sh -c "..."``.

    None when the command runs no ``gspo``. In a shell script the invocation ends at the first
    shell operator (``a || exec gspo x y`` gives ``[x, y]``).
    """
    if command is None:
        return None
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if len(argv) == 3 and argv[0] in ("sh", "bash", "/bin/sh") and argv[1] == "-c":
        lexer = shlex.shlex(argv[2], posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        argv = list(lexer)
    if "gspo" not in argv:
        return None
    rest = argv[argv.index("gspo") + 1:]
    for i, token in enumerate(rest):
        if token in _SHELL_OPERATORS:
            return rest[:i]
    return rest


@dataclass(frozen=True)
class Mount:
    type: str  # "bind" | "volume"
    source: str
    target: str
    read_only: bool


def mounts(service: dict[str, Any]) -> list[Mount]:
    """A service's volumes, short (``src:dst[:ro]``) and long syntax alike."""
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            out.append(Mount(v["type"], v["source"], v["target"], bool(v.get("read_only"))))
            continue
        parts = v.split(":")
        source, target = parts[0], parts[1]
        mode = parts[2] if len(parts) > 2 else "rw"
        kind = "bind" if source.startswith((".", "/", "~", "$")) else "volume"
        out.append(Mount(kind, source, target, "ro" in mode.split(",")))
    return out


def mount_for(service: dict[str, Any], path: str) -> Mount | None:
    """The mount a container path lies on (the deepest target that contains it)."""
    hits = [m for m in mounts(service)
            if path == m.target or path.startswith(m.target.rstrip("/") + "/")]
    return max(hits, key=lambda m: len(m.target), default=None)


def repo_file_for(service: dict[str, Any], path: str) -> Path | None:
    """The repository file a container path is bind-mounted from, if it is one."""
    m = mount_for(service, path)
    if m is None or m.type != "bind" or not m.source.startswith("./"):
        return None
    return REPO / m.source / Path(path).relative_to(m.target)


def gpu_requests(service: dict[str, Any]) -> list[dict[str, Any]]:
    """The service's device reservations that ask for a GPU."""
    devices = (service.get("deploy", {}).get("resources", {}).get("reservations", {})
               .get("devices", []))
    return [d for d in devices if "gpu" in d.get("capabilities", [])]


def container_port(mapping: str | dict[str, Any]) -> int:
    """The container side of a ``ports`` entry: ``[ip:]host:container[/proto]`` or long form."""
    if isinstance(mapping, dict):
        return int(mapping["target"])
    return int(str(mapping).rsplit(":", 1)[-1].split("/")[0])
