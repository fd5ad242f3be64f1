"""Server settings (env, overrides, refusals), the key modes, start-up failure, `gspo serve`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import redis
from pydantic import ValidationError

from gspo_rl.contract.schema import Keys
from gspo_rl.server.api.app import create_app
from gspo_rl.server.config import ServerSettings
from tests.conftest import RedisServer, free_port
from tests.helpers.serving import API_KEY, MODEL_NAME, running_server, serve_app

REPO = Path(__file__).resolve().parents[2]


def test_env_then_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSPO_MODEL", "/models/Qwen3-0.6B/")
    monkeypatch.setenv("GSPO_MAX_N", "16")
    monkeypatch.setenv("GSPO_QUEUE__GROUP_TTL_S", "30")
    s = ServerSettings()
    assert (s.model_name, s.max_n, s.queue.group_ttl_s) == ("Qwen3-0.6B", 16, 30.0)
    s = ServerSettings(max_n=4, queue={"finished_ttl_s": 5}, served_model_name="policy")
    assert (s.model_name, s.max_n) == ("policy", 4)
    assert (s.queue.group_ttl_s, s.queue.finished_ttl_s) == (30.0, 5.0)  # merged, not replaced


@pytest.mark.parametrize(("kw", "words"), [
    ({"api_key": "same", "admin_key": "same"}, "must differ"),
    ({"api_key": "  "}, "api_key is empty"),
    ({"max_n": 5000}, "max_group_size"),
    ({"engine": "tgi"}, "engine"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"mystery": 1}, "mystery"),
    ({"host": "0.0.0.0"}, "insecure-no-auth"),
    ({"host": "0.0.0.0", "admin_key": "a"}, "no api_key"),
    ({"host": "10.1.2.3"}, "beyond this machine"),
    ({"host": "gpu-box"}, "beyond this machine"),
])
def test_refused_settings(kw: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        ServerSettings(model="/m", **kw)


@pytest.mark.parametrize("kw", [
    {"host": "127.0.0.1"}, {"host": "127.0.0.2"}, {"host": "::1"}, {"host": "localhost"},
    {"host": "0.0.0.0", "api_key": "k"}, {"host": "0.0.0.0", "insecure_no_auth": True}])
def test_listening_beyond_loopback_needs_a_key_or_the_insecure_flag(kw: dict) -> None:
    s = ServerSettings(model="/m", **kw)
    insecure = s.api_key is None and s.host == "0.0.0.0"
    assert bool(s.security_warnings) == insecure


def test_insecure_no_auth_says_so(tiny_model_dir: Path, redis_server: RedisServer,
                                  caplog: pytest.LogCaptureFixture) -> None:
    """Told --insecure-no-auth, the server starts, and says so at start and in /health.
    (uvicorn binds loopback here, whatever the settings say: the test exposes nothing.)"""
    with caplog.at_level("WARNING", logger="gspo_rl.server.api.app"), running_server(
            tiny_model_dir, redis_server.url, api_key=None, admin_key=None, host="0.0.0.0",
            insecure_no_auth=True) as s:
        health = httpx.get(f"{s.url}/health", timeout=10).json()
    assert any("insecure_no_auth" in w and "admin routes" in w for w in health["warnings"])
    assert any("INSECURE" in r.getMessage() for r in caplog.records)


def test_gspo_serve_refuses_an_open_port_without_keys(tiny_model_dir: Path) -> None:
    """`gspo serve --host 0.0.0.0` with no key stops before it loads anything, and says how
    to fix it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GSPO_")}
    out = subprocess.run(
        [sys.executable, "-m", "gspo_rl.cli", "serve", "--model", str(tiny_model_dir),
         "--host", "0.0.0.0", "--port", str(free_port())],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "--insecure-no-auth" in out.stderr and "GSPO_API_KEY" in out.stderr, out.stderr


def test_open_server_without_keys(tiny_model_dir: Path, redis_server: RedisServer) -> None:
    """No keys at all (a local setup): /v1 and /admin are open."""
    with running_server(tiny_model_dir, redis_server.url, api_key=None, admin_key=None) as s:
        client = openai.OpenAI(base_url=s.v1, api_key="anything", max_retries=0, timeout=60)
        r = client.completions.create(model=MODEL_NAME, prompt=[1, 2], max_tokens=2)
        assert len(r.choices[0].model_extra["token_ids"]) <= 2
        assert httpx.post(f"{s.url}/admin/resume", timeout=10).status_code == 200


def test_admin_closed_with_api_key_but_no_admin_key(tiny_model_dir: Path,
                                                    redis_server: RedisServer) -> None:
    with running_server(tiny_model_dir, redis_server.url, admin_key=None) as s:
        for headers in ({}, {"Authorization": f"Bearer {API_KEY}"}):
            r = httpx.post(f"{s.url}/admin/pause", headers=headers, timeout=10)
            assert r.status_code == 403 and "admin key" in r.json()["error"]["message"]


def test_start_fails_fast_without_redis(tiny_model_dir: Path) -> None:
    settings = ServerSettings(model=str(tiny_model_dir),
                              redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(RuntimeError, match="exited during start-up"), \
            serve_app(create_app(settings), timeout=60):
        pass


def test_a_config_file_below_env_and_flags(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``gspo serve --config``: defaults < file < GSPO_* environment < flags."""
    path = tmp_path / "server.toml"
    path.write_text('model = "/m/tiny"\nmax_n = 4\nport = 9001\nserved_model_name = "f"\n'
                    '[queue]\ngroup_ttl_s = 100\nfinished_ttl_s = 50\n')
    monkeypatch.setenv("GSPO_MAX_N", "6")
    s = ServerSettings.from_toml(path, port=9002, queue={"finished_ttl_s": 5})
    assert (s.model, s.served_model_name, s.max_n, s.port) == ("/m/tiny", "f", 6, 9002)
    assert (s.queue.group_ttl_s, s.queue.finished_ttl_s) == (100.0, 5.0)
    assert type(s) is ServerSettings
    path.write_text('model = "/m/tiny"\nmax_m = 4\n')
    with pytest.raises(ValidationError, match="max_m"):
        ServerSettings.from_toml(path)
    with pytest.raises(ValueError, match="no such config file"):
        ServerSettings.from_toml(tmp_path / "nope.toml")


def test_gspo_serve_subprocess(tiny_model_dir: Path, redis_server: RedisServer,
                               tmp_path: Path) -> None:
    """The console entry point: a config file, env and flags; its settings logged once at
    the start, keys hidden; serves the openai client, stops on SIGTERM."""
    port = free_port()
    config = tmp_path / "server.toml"
    config.write_text(f'served_model_name = "m"\nserver_id = "cli-test"\nmax_n = 8\n'
                      f'redis_url = "{redis_server.url}"\nport = {free_port()}\n')
    env = {**os.environ, "GSPO_API_KEY": "env-key", "GSPO_MAX_N": "2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gspo_rl.cli", "serve", "--config", str(config), "--model",
         str(tiny_model_dir), "--port", str(port), "--log-level", "info"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "gspo serve did not become healthy"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="env-key",
                               max_retries=0, timeout=60)
        r = client.chat.completions.create(model="m", messages=[{"role": "user",
                                                                 "content": "hi"}],
                                           max_tokens=3, n=2)
        assert len(r.choices) == 2
        with pytest.raises(openai.BadRequestError, match="limit of 2"):
            client.chat.completions.create(model="m", messages=[{"role": "user",
                                                                 "content": "hi"}], n=3)
        registry = redis.Redis.from_url(redis_server.url, socket_timeout=5)
        assert registry.hexists(Keys().servers, "cli-test")  # the heartbeat registered it
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal: -SIGTERM is the exit code
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        assert not registry.hexists(Keys().servers, "cli-test")  # the lifespan's teardown ran
        out = proc.stdout.read().decode() if proc.stdout else ""
        (dump,) = [line for line in out.splitlines() if "gspo serve config: {" in line]
        assert '"max_n": 2' in dump and '"api_key": "**********"' in dump
        assert "env-key" not in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
