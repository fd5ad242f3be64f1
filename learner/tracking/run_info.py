"""What a tracked run records about the code it ran: the git commit (and whether the work tree
had changes) of the working directory's repository, the gspo-rl source's when that is another
checkout, and the installed gspo-rl version. Each git call is bounded (a missing ``git`` or a
directory outside any repository gives no entry, never an error)."""

from __future__ import annotations

import contextlib
import subprocess
from importlib import metadata
from pathlib import Path

_GIT_TIMEOUT_S = 10.0
_SOURCE = Path(__file__).resolve().parent


def _git(cwd: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                             timeout=_GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(cwd: Path) -> dict[str, str]:
    """``{"commit", "dirty", "root"}`` of the repository holding ``cwd`` (empty outside one);
    ``dirty`` is "true" when tracked files have uncommitted changes."""
    root = _git(cwd, "rev-parse", "--show-toplevel")
    commit = _git(cwd, "rev-parse", "HEAD") if root else None
    if not root or not commit:
        return {}
    changes = _git(cwd, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": "unknown" if changes is None else str(bool(changes)).lower(),
            "root": root}


def code_tags(cwd: Path | None = None) -> dict[str, str]:
    """Tags of the code a run executes: ``git_commit``, ``git_dirty``, ``git_root`` (the
    working directory's repository), ``gspo_rl_commit`` (the gspo-rl source's, when it is a
    checkout elsewhere) and ``gspo_rl_version``."""
    tags: dict[str, str] = {}
    here = git_state(cwd or Path.cwd())
    tags.update({f"git_{k}": v for k, v in here.items()})
    source = git_state(_SOURCE)
    if source and source.get("root") != here.get("root"):
        tags["gspo_rl_commit"] = source["commit"]
    with contextlib.suppress(metadata.PackageNotFoundError):
        tags["gspo_rl_version"] = metadata.version("gspo-rl")
    return tags
