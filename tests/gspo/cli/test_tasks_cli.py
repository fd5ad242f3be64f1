"""Tasks from data on the command line (the CLI as a subprocess, a real server): ``gspo env
data --data ... --verifier ...`` trains on a file and evaluates it alongside; ``gspo eval``
evaluates a checkpoint (it starts its own Redis and server) and writes the JSON report; bad
task settings are one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, running_server

ROOT = Path(__file__).resolve().parents[3]
MATH = ROOT / "clients" / "examples" / "math"


def gspo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GSPO_API_KEY": API_KEY, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gspo_rl.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_gspo_env_data_trains_and_evaluates(tmp_path: Path, tiny_model_dir: Path,
                                            redis_server: RedisServer) -> None:
    test = tmp_path / "test.jsonl"
    test.write_text("".join((MATH / "test.jsonl").read_text().splitlines(True)[:3]))
    out = tmp_path / "evals.jsonl"
    with running_server(tiny_model_dir, redis_server.url) as s:
        r = gspo("env", "data", "--data", str(MATH / "two_step.jsonl"), "--verifier",
                 "numeric", "--url", s.url, "--groups", "3", "--group-size", "2",
                 "--eval-data", str(test), "--eval-out", str(out))
        evals = httpx.get(f"{s.url}/v1/evals", headers={"Authorization": f"Bearer {API_KEY}"},
                          timeout=10).json()["evals"]
    assert r.returncode == 0, r.stderr
    assert "3 groups completed" in r.stdout and "source two_step: 6 samples" in r.stdout
    assert "eval eval v0: mean reward" in r.stdout
    assert json.loads(out.read_text().splitlines()[0])["metrics"]["tasks"] == 3
    assert evals and evals[0]["name"] == "eval" and "pass@1" in evals[0]["metrics"]


def test_gspo_eval_a_checkpoint(tmp_path: Path, tiny_model_dir: Path) -> None:
    report = tmp_path / "report.json"
    r = gspo("eval", str(MATH / "tasks.toml"), "--model", str(tiny_model_dir), "--limit", "4",
             "--samples", "2", "--max-tokens", "8", "--out", str(report))
    assert r.returncode == 0, r.stderr
    assert "eval math v0: mean reward" in r.stdout and "pass@2" in r.stdout
    body = json.loads(report.read_text())
    assert body["metrics"]["tasks"] == 4 and len(body["results"]) == 4
    assert all(len(t["texts"]) == 2 for t in body["results"])


def test_bad_task_settings_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[sources]]\npath = "x.jsonl"\ngroup_sise = 2\n')
    for args in (("env", str(bad)), ("env", "data"), ("up", "--tasks", str(bad)),
                 ("eval", "--data", "nowhere.jsonl", "--url", "http://127.0.0.1:9"),
                 ("env", "data", "--data", str(MATH / "test.jsonl"), "--verifier", "fuzzy")):
        r = gspo(*args, timeout=120)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 3, r.stderr
