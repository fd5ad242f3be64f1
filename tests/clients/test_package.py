"""The environment SDK installs and runs without torch: ``clients/`` built as its own
distribution (``gspo-rl-client``, clients/pyproject.toml) into a fresh venv that does not see
this environment's packages; there, ``torch`` is not importable, ``clients`` is the installed
copy, it posts a reward to a real server (real uvicorn, real Redis), and it reads the example
tasks from data it ships (JSONL, a numeric verifier: no extra needed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RedisServer
from tests.helpers.queue import ApiServer, open_group

CLIENTS = Path(__file__).resolve().parents[2] / "clients"

PROBE = textwrap.dedent("""
    import importlib.util, json, sys
    import gspo_rl.client
    from gspo_rl.client import GSPOClient, RewardAlreadySet
    from importlib.metadata import requires
    url, rollout_id = sys.argv[1], sys.argv[2]
    with GSPOClient(url) as c:
        first = c.post_reward(rollout_id, 1.0)
        try:
            c.post_reward(rollout_id, 0.0)
            conflict = None
        except RewardAlreadySet as exc:
            conflict = exc.code
    import pathlib
    import gspo_rl.client.examples
    from gspo_rl.client.tasks import TaskConfig, build_environment
    from gspo_rl.client.verifiers import make_verifier
    math = pathlib.Path(gspo_rl.client.examples.__file__).parent / "math" / "tasks.toml"
    tasks = len(build_environment(TaskConfig.load(math)).mixture)
    print(json.dumps({
        "tasks": tasks, "numeric": make_verifier("numeric")("Answer: 5", "5").correct,
        "file": gspo_rl.client.__file__, "torch": importlib.util.find_spec("torch") is not None,
        "stored": first["stored"], "conflict": conflict,
        "requires": sorted(requires("gspo-rl-client") or []),
    }))
""")


@pytest.fixture
def api(redis_server: RedisServer) -> Iterator[ApiServer]:
    server = ApiServer(redis_server.url)
    yield server
    server.close()


def _run(cmd: list[str], cwd: Path, timeout: float) -> str:
    # Neither PYTHONPATH nor the working directory may put this checkout on the path.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=env)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.slow
def test_sdk_installs_and_works_without_torch(tmp_path: Path, api: ApiServer) -> None:
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info beside the sources
    shutil.copytree(CLIENTS, src, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, timeout=120)
    py = str(venv / "bin" / "python")
    _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src)],
         tmp_path, timeout=480)
    rid = api.run(open_group(api.store, "g-pkg", 1))[0]
    out = json.loads(_run([py, "-c", PROBE, api.url, rid], tmp_path,
                          timeout=120).splitlines()[-1])
    assert out["torch"] is False
    assert (out["tasks"], out["numeric"]) == (220, True)  # tasks from data, its example files
    assert Path(out["file"]).is_relative_to(venv)
    assert (out["stored"], out["conflict"]) == (1, "conflict")
    core = [r for r in out["requires"] if "extra ==" not in r]  # the extras: data, math, ...
    assert [r.split(">")[0].split("=")[0] for r in core] == ["httpx", "openai", "pydantic"]
