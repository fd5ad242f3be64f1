"""Where gspo plugs into verifiers 0.4 (``verifiers.v1``): the model client its interception
server relays every harness request through, and how its local runtime runs a harness program.

- ``RelayConfig`` / ``EpisodeRelay``: verifiers' own relay client (``EvalClient``: the request
  is forwarded as the harness wrote it, the answer returned as our server wrote it), pointed
  at our rollout server, adding to each chat completion the ``rollout_id`` of the episode the
  request belongs to (``bind``: a verifiers trace id -> a gspo rollout id) or
  ``"record": false`` (an evaluation's episode; a non-trainable agent such as a judge). So
  every turn is recorded token-exact by the server: the chat template is applied there,
  nothing is re-tokenised here. Only the chat-completions dialect is served.
- ``run_forked`` / ``run_in_this_python``: verifiers' subprocess runtime installs each
  harness program's declared dependencies with ``uv`` from the package index at run time; the
  ``verifiers`` extra already installed them here, so the program runs with this interpreter
  instead (offline, no second environment), started by a fork server that imported them once
  (``prefork``) or as a fresh interpreter. A dependency that is missing or at another version
  is refused with its name.

``install()`` makes both take effect in this process (idempotent); it checks the verifiers
version it was written against and refuses any other.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import os
import re
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SUPPORTED = "0.4."
_BINDINGS: dict[str, Binding] = {}
_installed: list[bool] = []


@dataclass(frozen=True)
class Binding:
    """What one verifiers trace's requests carry: its rollout (None: unrecorded) and the key
    of our server."""

    rollout_id: str | None
    api_key: str | None


def bind(trace_id: str, rollout_id: str | None, api_key: str | None) -> None:
    _BINDINGS[trace_id] = Binding(rollout_id, api_key)


def unbind(trace_id: str) -> None:
    _BINDINGS.pop(trace_id, None)


def check_version() -> str:
    """The installed verifiers version; ValueError unless it is the API this adapter runs."""
    version = importlib.metadata.version("verifiers")
    if not version.startswith(SUPPORTED):
        raise ValueError(f"verifiers {version} is installed; gspo runs the {SUPPORTED}x API "
                         "(verifiers.v1: Env, Taskset, Harness): pip install 'gspo-rl[verifiers]'"
                         " (the older 0.1.x SingleTurnEnv/MultiTurnEnv/ToolEnv API is not "
                         "supported)")
    return version


def _relay_classes() -> tuple[type, type]:
    from verifiers.v1.clients.eval import EvalClient
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.dialects.chat import ChatDialect
    from verifiers.v1.errors import model_error

    class RelayConfig(EvalClientConfig):  # type: ignore[misc]  # verifiers ships no types
        """Our rollout server as verifiers' model endpoint (``base_url`` ends in ``/v1``)."""

        api_key_var: str = "GSPO_API_KEY"

    class EpisodeRelay(EvalClient):  # type: ignore[misc]  # verifiers ships no types
        """``EvalClient`` that tags each request with its episode (module docstring)."""

        def _bound(self, dialect: Any, body: dict[str, Any], session_id: str | None
                   ) -> tuple[dict[str, Any], Binding]:
            if not isinstance(dialect, ChatDialect):
                raise model_error(f"the harness spoke the {type(dialect).__name__} API; the "
                                  "gspo rollout server serves chat completions only: use a "
                                  "harness that speaks them (null, bash)", status_code=400)
            binding = _BINDINGS.get(session_id or "", Binding(None, None))
            extra = {"rollout_id": binding.rollout_id} if binding.rollout_id else {
                "record": False}
            return {**body, **extra}, binding

        def _headers(self, dialect: Any, incoming: Mapping[str, str] | None,
                     session_id: str | None) -> Any:
            headers = super()._headers(dialect, incoming, session_id)
            binding = _BINDINGS.get(session_id or "")
            if binding is not None and binding.api_key:
                headers.update(dialect.auth_headers(binding.api_key))
            return headers

        async def get_response(self, dialect: Any, body: dict[str, Any], sampling: Any,
                               session_id: str | None = None, turn: Any = None,
                               headers: Mapping[str, str] | None = None) -> Any:
            tagged, _ = self._bound(dialect, body, session_id)
            return await super().get_response(dialect, tagged, sampling, session_id, turn,
                                              headers)

        async def relay(self, dialect: Any, body: dict[str, Any], session_id: str | None = None,
                        headers: Mapping[str, str] | None = None) -> Any:
            tagged, _ = self._bound(dialect, body, session_id)
            return await super().relay(dialect, tagged, session_id, headers)

    return RelayConfig, EpisodeRelay


_CLASSES: list[tuple[type, type]] = []
_ORIGINAL_PREPARE: list[Any] = []
_MODE: list[str] = []


def relay_config(base_url: str) -> Any:
    """The client config that routes a verifiers run's requests to our server."""
    install()
    return _CLASSES[0][0](base_url=base_url)


def _requirements(script: bytes) -> list[str]:
    """The PEP 723 ``dependencies`` of a script."""
    block = re.search(rb"# /// script\n(.*?)# ///", script, re.S)
    if block is None:
        return []
    deps = re.search(r"dependencies\s*=\s*\[(.*?)\]", block.group(1).decode(), re.S)
    return re.findall(r"\"([^\"]+)\"", deps.group(1)) if deps else []


def check_requirements(script: bytes) -> None:
    """RuntimeError naming each declared dependency not installed here as asked."""
    from packaging.requirements import Requirement

    bad = []
    for text in _requirements(script):
        req = Requirement(text)
        try:
            have = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            bad.append(f"{req.name} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            bad.append(f"{text} (installed: {have})")
    if bad:
        raise RuntimeError("the harness program needs packages this Python lacks: "
                           f"{', '.join(bad)}; install them, or run verifiers' uv-managed "
                           "programs with --env-arg runtime_python=uv")


def preload_modules(script: bytes) -> list[str]:
    """The importable top-level modules of a script's declared dependencies."""
    import importlib.util

    from packaging.requirements import Requirement

    names = [Requirement(t).name.replace("-", "_").lower() for t in _requirements(script)]
    return [n for n in names if importlib.util.find_spec(n) is not None]


async def _write_script(self: Any, script: str | bytes) -> tuple[bytes, str]:
    """The script in the runtime's (shared) script folder, named by its digest: written
    whole to a temporary name and renamed, so that a program started meanwhile (by another
    episode, or another process) never reads half of it."""
    data = script.encode() if isinstance(script, str) else script
    check_requirements(data)
    path = f"{self.scripts_dir}/{hashlib.sha256(data).hexdigest()}.py"
    if not await asyncio.to_thread(_holds, path, data):
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        await self.write(tmp, data)
        await asyncio.to_thread(os.replace, tmp, path)
    return data, path


def _holds(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read() == data
    except OSError:
        return False


async def run_in_this_python(self: Any, script: str | bytes, env: dict[str, str] | None = None,
                             *, activate: bool = True) -> list[str]:
    """``Runtime.prepare_uv_script`` for the local subprocess runtime: the script written to
    the runtime's script folder, run by this interpreter (module docstring)."""
    _, path = await _write_script(self, script)
    return [sys.executable, path]


async def run_forked(self: Any, script: str | bytes, env: dict[str, str] | None = None,
                     *, activate: bool = True) -> list[str]:
    """As ``run_in_this_python``, started by a fork server that imported the script's
    dependencies once (``prefork``): milliseconds per start instead of seconds."""
    from gspo_rl.client.adapters.verifiers.prefork import launcher

    data, path = await _write_script(self, script)
    # the first start of each program waits for its server (imports, ~1 s)
    prefix = await asyncio.to_thread(launcher, preload_modules(data), path)
    return [*prefix, path]


def install(runtime_python: str | None = None) -> None:
    """Route verifiers' model calls through ``EpisodeRelay`` and run local harness programs
    with this interpreter: forked from a server that imported their dependencies
    (``"prefork"``), or each a fresh interpreter (``"this"``); ``"uv"`` keeps verifiers' own
    way (each program's dependencies installed by uv at run time); None: as chosen before
    (``prefork`` the first time). Idempotent."""
    check_version()
    if not _CLASSES:
        _CLASSES.append(_relay_classes())
    import verifiers.v1.interception.server as server
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    if not _installed:
        original = server.resolve_client
        config_cls, relay_cls = _CLASSES[0]

        def resolve_client(config: Any) -> Any:
            return relay_cls(config) if isinstance(config, config_cls) else original(config)

        server.resolve_client = resolve_client
        _installed.append(True)
        _ORIGINAL_PREPARE.append(SubprocessRuntime.prepare_uv_script)
    modes = {"prefork": run_forked, "this": run_in_this_python, "uv": _ORIGINAL_PREPARE[0]}
    if runtime_python is None and _MODE:
        return
    mode = runtime_python or "prefork"
    if mode not in modes:
        raise ValueError(f"runtime_python must be {' | '.join(modes)}, got {mode!r}")
    # Process-wide (verifiers keeps it on the class): the last environment loaded decides.
    SubprocessRuntime.prepare_uv_script = modes[mode]
    _MODE[:] = [mode]
