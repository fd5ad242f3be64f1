"""docker-compose.yml, checked without a Docker engine.

The file is validated against the Compose Specification's JSON schema (vendored in
tests/data, see its README), before and after ``${VAR}`` interpolation from .env.example. Every
service's command is parsed by the real ``gspo`` CLI parser (click, through typer) and its
values by the real settings classes (ServerSettings, LearnerConfig with the mounted TOML),
without running anything. Then the wiring between services is checked per profile: ports,
URLs, Redis, keys, the weight-broadcast rendezvous address, models, GPUs, volumes, images.
"""

from __future__ import annotations

import copy
import json
import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import typer.main

from gspo_rl.cli import app
from gspo_rl.cli.engine_args import serve_flags
from gspo_rl.launch.up import UpConfig
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.server.config import ServerSettings
from tests.helpers.compose import (
    ENV_EXAMPLE,
    REPO,
    SCHEMA_FILE,
    MissingVariable,
    container_port,
    gpu_requests,
    gspo_argv,
    interpolate,
    load_compose,
    mount_for,
    parse_dotenv,
    referenced_variables,
    repo_file_for,
    required_variable,
    services_in,
)

PROFILES = ("gpu", "gpu1", "cpu")
# Test ids without the bare word "gpu": conftest skips items with a "gpu" keyword on CPU hosts.
for_each_profile = pytest.mark.parametrize("profile", PROFILES,
                                           ids=[f"{p}-profile" for p in PROFILES])


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def dotenv() -> dict[str, str]:
    return parse_dotenv(ENV_EXAMPLE.read_text())


@pytest.fixture(scope="module")
def env_values(dotenv: dict[str, str]) -> dict[str, str]:
    """.env.example as a user fills it in: the keys it leaves empty get fresh random values."""
    return {k: v or secrets.token_urlsafe(16) for k, v in dotenv.items()}


@pytest.fixture(scope="module")
def doc(raw: dict[str, Any], env_values: dict[str, str]) -> dict[str, Any]:
    return interpolate(raw, env_values)


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def schema_errors(validator: jsonschema.protocols.Validator, doc: dict[str, Any]) -> list[str]:
    return [f"{e.json_path}: {e.message[:300]}" for e in validator.iter_errors(doc)]


# ------------------------------------------------------------------------ the specification


def test_vendored_schema_is_the_compose_specification(
        validator: jsonschema.protocols.Validator) -> None:
    schema = validator.schema
    assert schema["title"] == "Compose Specification"
    assert {"services", "volumes", "networks"} <= set(schema["properties"])
    assert {"service", "deployment", "healthcheck", "volume"} <= set(schema["$defs"])


@pytest.mark.parametrize("stage", ["as written", "interpolated"])
def test_compose_file_matches_the_specification(
        validator: jsonschema.protocols.Validator, raw: dict[str, Any], doc: dict[str, Any],
        stage: str) -> None:
    assert schema_errors(validator, raw if stage == "as written" else doc) == []


@pytest.mark.parametrize("path,value", [
    (("services", "redis", "healthcheck", "tset"), ["CMD", "true"]),  # unknown key
    (("services", "learner", "depends_on", "server", "condition"), "healthy"),  # bad enum
    (("services", "server", "deploy", "resources", "reservations", "devices"), "nvidia"),
    (("volumes", "bad name!"), {}),  # name outside the allowed pattern
])
def test_schema_rejects_broken_files(validator: jsonschema.protocols.Validator,
                                     raw: dict[str, Any], path: tuple[str, ...],
                                     value: Any) -> None:
    """The validation bites: one wrong key or value anywhere is reported."""
    broken = copy.deepcopy(raw)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert schema_errors(validator, broken)


# ------------------------------------------------------------------------ .env and keys


def test_every_variable_is_documented_in_env_example(raw: dict[str, Any],
                                                     dotenv: dict[str, str]) -> None:
    used = referenced_variables(raw)
    assert used, "the compose file should take its keys and model from .env"
    assert sorted(used - set(dotenv)) == []
    unused = {k for k in dotenv if not k.startswith("COMPOSE_")} - used
    assert sorted(unused) == [], "stale variables in .env.example"
    assert set(dotenv["COMPOSE_PROFILES"].split(",")) <= set(PROFILES)


def key_variable(service: dict[str, Any], name: str) -> str:
    value = service.get("environment", {}).get(name)
    var = required_variable(value)
    assert var is not None, f"{name} must be set as ${{VAR:?message}} (required), got {value!r}"
    return var


@for_each_profile
def test_keys_agree_between_services(raw: dict[str, Any], profile: str) -> None:
    roles = roles_of(services_in(raw, profile))
    server, learner, env = (roles[r][1] for r in ("serve", "learn", "env"))
    api = key_variable(server, "GSPO_API_KEY")
    admin = key_variable(server, "GSPO_ADMIN_KEY")
    assert api != admin
    assert key_variable(env, "GSPO_API_KEY") == api
    assert key_variable(learner, "GSPO_ADMIN_KEY") == admin
    assert "GSPO_ADMIN_KEY" not in env.get("environment", {}), "environments never hold it"
    for svc in (server, learner, env):
        assert not any("KEY" in a for a in gspo_argv(svc.get("command")) or []), \
            "keys go in the environment: flags show in `ps`"


def test_compose_refuses_to_start_without_keys(raw: dict[str, Any],
                                               env_values: dict[str, str]) -> None:
    for var in ("GSPO_API_KEY", "GSPO_ADMIN_KEY", "GSPO_REDIS_PASSWORD"):
        with pytest.raises(MissingVariable, match=f"{var}.*\\.env"):
            interpolate(raw, {**env_values, var: ""})


# ------------------------------------------------------------------------ commands


def parse_gspo(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """``gspo ARGV`` parsed by the CLI's own click parser; nothing is invoked."""
    root = typer.main.get_command(app)
    commands = root.commands  # type: ignore[attr-defined]  (a click group)
    assert argv, "gspo without a subcommand"
    sub = commands.get(argv[0])
    assert sub is not None, f"`gspo {argv[0]}` is not a gspo command ({sorted(commands)})"
    ctx = sub.make_context(argv[0], list(argv[1:]))
    return argv[0], dict(ctx.params)


def roles_of(services: dict[str, dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
    """subcommand -> (service name, service) for serve / learn / env (exactly one each)."""
    found: dict[str, list[str]] = {}
    for name, svc in services.items():
        argv = gspo_argv(svc.get("command"))
        if argv:
            found.setdefault(argv[0], []).append(name)
    out = {}
    for role in ("serve", "learn", "env"):
        assert len(found.get(role, [])) == 1, f"want one `gspo {role}` service: {found}"
        out[role] = (found[role][0], services[found[role][0]])
    return out


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No GSPO_* variables of this machine leak into the parsing (click reads env vars)."""
    for k in list(os.environ):
        if k.startswith("GSPO_"):
            monkeypatch.delenv(k)
    return monkeypatch


def server_settings(svc: dict[str, Any], mp: pytest.MonkeyPatch) -> ServerSettings:
    """What `gspo serve` would build from this service's command and environment."""
    for k, v in svc.get("environment", {}).items():
        mp.setenv(k, str(v))
    sub, params = parse_gspo(gspo_argv(svc["command"]) or [])
    assert sub == "serve"
    return ServerSettings(**serve_flags(params))


def learner_config(svc: dict[str, Any]) -> LearnerConfig:
    """What `gspo learn` would build: the TOML it reads is the repo file mounted at --config."""
    sub, params = parse_gspo(gspo_argv(svc["command"]) or [])
    assert sub == "learn"
    config = params.pop("config")
    toml_file = repo_file_for(svc, config) if config else None
    assert config is None or (toml_file is not None and toml_file.is_file()), \
        f"--config {config} is not a file bind-mounted from the repository"
    params.pop("log_level")
    env = svc.get("environment", {})
    if params.get("redis_url") is None:  # as `gspo learn` does: the flag, else the env var
        params["redis_url"] = env.get("GSPO_REDIS_URL")
    return LearnerConfig.from_toml(toml_file, **params, admin_key=env.get("GSPO_ADMIN_KEY"))


def test_every_service_command_is_a_valid_gspo_command(doc: dict[str, Any],
                                                       clean_env: pytest.MonkeyPatch) -> None:
    checked = []
    for name, svc in doc["services"].items():
        argv = gspo_argv(svc.get("command"))
        if argv is None:  # tests/deploy/test_monitoring.py checks the monitoring profile
            assert name == "redis" or svc.get("profiles") == ["monitoring"], \
                f"{name} runs no gspo command"
            continue
        with clean_env.context() as mp:
            for k, v in svc.get("environment", {}).items():
                mp.setenv(k, str(v))
            sub, params = parse_gspo(argv)
            if sub == "serve":
                server_settings(svc, mp)
            elif sub == "learn":
                learner_config(svc)
            elif sub == "env":  # the spec(s) of GSPO_ENV (.env.example: the demo)
                assert params["names"]
        checked.append(sub)
    assert sorted(set(checked)) == ["env", "learn", "serve", "tiny-model"]


@pytest.mark.parametrize("argv,error", [
    (["serve", "--no-such-flag", "1"], "NoSuchOption"),
    (["serve", "--port", "http"], "BadParameter"),
    (["learn", "--weight-sync"], "BadOptionUsage"),
    (["env", "alphabet", "--no-such-flag"], "NoSuchOption"),
    (["train"], "AssertionError"),
])
def test_command_check_rejects_bad_command_lines(argv: list[str], error: str,
                                                 clean_env: pytest.MonkeyPatch) -> None:
    """(click's exception classes by name: typer may carry its own copy of click.)"""
    with pytest.raises(Exception) as info:  # noqa: B017  (the class is checked below)
        parse_gspo(argv)
    assert error in {c.__name__ for c in type(info.value).__mro__}


def test_gspo_argv_reads_shell_wrapped_commands() -> None:
    assert gspo_argv(["sh", "-c", "test -f /m/config.json || exec gspo tiny-model /m"]) == \
        ["tiny-model", "/m"]
    assert gspo_argv("gspo env alphabet --url http://s:1") == ["env", "alphabet", "--url",
                                                                "http://s:1"]
    assert gspo_argv(["redis-server", "/etc/redis.conf"]) is None


# ------------------------------------------------------------------------ wiring per profile


def redis_service(services: dict[str, dict[str, Any]]) -> str:
    names = [n for n, s in services.items() if str(s.get("image", "")).startswith("redis:")]
    assert len(names) == 1, names
    return names[0]


def redis_conf_port() -> int:
    m = re.search(r"^port\s+(\d+)", (REPO / "docker" / "redis.conf").read_text(), re.M)
    assert m is not None
    return int(m.group(1))


def depends(svc: dict[str, Any]) -> dict[str, str]:
    return {k: v["condition"] for k, v in svc.get("depends_on", {}).items()}


@for_each_profile
def test_ports_and_urls_agree(doc: dict[str, Any], profile: str,
                              clean_env: pytest.MonkeyPatch) -> None:
    services = services_in(doc, profile)
    roles = roles_of(services)
    (server_name, server), (_, env) = roles["serve"], roles["env"]
    s = server_settings(server, clean_env)
    assert s.host == "0.0.0.0", "bound to loopback, other containers could not reach it"
    advertised = urlsplit(s.advertise_url or "")
    assert (advertised.scheme, advertised.hostname, advertised.port) == \
        ("http", server_name, s.port), "the learner must reach the server at its service name"
    url = urlsplit(parse_gspo(gspo_argv(env["command"]) or [])[1]["url"])
    assert (url.scheme, url.hostname, url.port) == ("http", server_name, s.port)
    assert [container_port(p) for p in server.get("ports", [])] == [s.port]
    probe = " ".join(server["healthcheck"]["test"])
    assert f"http://127.0.0.1:{s.port}/health" in probe


@for_each_profile
def test_server_and_learner_share_redis_model_and_rendezvous(
        doc: dict[str, Any], profile: str, clean_env: pytest.MonkeyPatch) -> None:
    services = services_in(doc, profile)
    roles = roles_of(services)
    (_, server), (learner_name, learner) = roles["serve"], roles["learn"]
    s, cfg = server_settings(server, clean_env), learner_config(learner)
    redis_name = redis_service(services)
    for redis_url in (s.redis_url, cfg.redis_url):
        u = urlsplit(redis_url)
        assert (u.scheme, u.hostname, u.port) == ("redis", redis_name, redis_conf_port())
    assert s.redis_url == cfg.redis_url and s.key_prefix == cfg.key_prefix
    assert cfg.weight_sync == "broadcast"
    assert cfg.sync_master_addr == learner_name, \
        "servers connect to the learner's rendezvous store at this address"
    # gpu1: the server shares the learner's GPU and gets CUDA IPC handles; gloo is the fallback
    assert cfg.sync_backend == {"gpu": "nccl", "gpu1": "gloo", "cpu": "gloo"}[profile]
    assert s.engine == {"gpu": "vllm", "gpu1": "vllm", "cpu": "hf"}[profile]
    on_gpu = profile.startswith("gpu")
    assert cfg.device.startswith("cuda") if on_gpu else cfg.device == "cpu"
    # bf16 sampler (the default dtype on GPUs), float32 learner: recompute pi_old (README);
    # on the CPU "auto" picks it too (the decoupled objective for a staleness bound above 0)
    assert s.dtype == "auto" and cfg.old_logprobs == ("recompute" if on_gpu else "auto")
    assert cfg.pi_old == "recompute"
    # The learner starts from the very weights the server serves.
    assert s.model == cfg.model
    m_server, m_learner = mount_for(server, s.model), mount_for(learner, cfg.model)
    assert m_server is not None and m_learner is not None
    assert m_server.source == m_learner.source and m_server.read_only and m_learner.read_only
    # Checkpoints outlive the container.
    assert cfg.save_dir is not None and cfg.resume
    ckpt = mount_for(learner, cfg.save_dir)
    assert ckpt is not None and ckpt.type == "volume" and ckpt.source in doc["volumes"]
    assert admin_key_of(s) == admin_key_of(cfg)


def admin_key_of(obj: ServerSettings | LearnerConfig) -> str | None:
    return obj.admin_key.get_secret_value() if obj.admin_key is not None else None


@for_each_profile
def test_start_order_waits_for_health(doc: dict[str, Any], profile: str) -> None:
    services = services_in(doc, profile)
    roles = roles_of(services)
    server_name, learner_name, env_name = (roles[r][0] for r in ("serve", "learn", "env"))
    redis_name = redis_service(services)
    assert depends(services[server_name])[redis_name] == "service_healthy"
    assert depends(services[learner_name]) == {redis_name: "service_healthy",
                                               server_name: "service_healthy"}
    assert depends(services[env_name]) == {server_name: "service_healthy"}
    for name, svc in services.items():
        for target, condition in depends(svc).items():
            assert target in services, f"{name} waits for {target}, not in profile {profile}"
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{target} has no healthcheck"


def test_cpu_model_is_made_before_the_server_starts(doc: dict[str, Any],
                                                    clean_env: pytest.MonkeyPatch) -> None:
    services = services_in(doc, "cpu")
    (_, server), (_, learner) = roles_of(services)["serve"], roles_of(services)["learn"]
    makers = {n: gspo_argv(s.get("command")) for n, s in services.items()
              if (gspo_argv(s.get("command")) or [""])[0] == "tiny-model"}
    assert len(makers) == 1, makers
    (init_name, argv), = makers.items()
    assert services[init_name].get("restart") == "no", "a one-shot job"
    path = parse_gspo(argv or [])[1]["path"]
    assert server_settings(server, clean_env).model == path
    made_on = mount_for(services[init_name], path)
    assert made_on is not None and made_on.type == "volume" and not made_on.read_only
    for svc in (server, learner):
        used_from = mount_for(svc, path)
        assert used_from is not None and used_from.source == made_on.source
    assert depends(server)[init_name] == "service_completed_successfully"


def test_gpu_services_reserve_gpus_and_cpu_services_none(doc: dict[str, Any],
                                                         clean_env: pytest.MonkeyPatch) -> None:
    needs_gpu = {n for n, s in doc["services"].items() if gpu_requests(s)}
    wanted = set()
    for profile in ("gpu", "gpu1"):
        roles = roles_of(services_in(doc, profile))
        (server_name, server), (learner_name, learner) = roles["serve"], roles["learn"]
        wanted |= {server_name, learner_name}
        ids = []
        for svc in (server, learner):
            (req,) = gpu_requests(svc)
            assert req["driver"] == "nvidia" and "count" not in req
            assert len(req["device_ids"]) == 1
            ids.append(req["device_ids"][0])
        if profile == "gpu":
            assert ids[0] != ids[1], "the NCCL broadcast needs the server and learner on two GPUs"
        else:  # one GPU: CUDA IPC handles, which need a shared IPC namespace; vLLM leaves room
            assert ids[0] == ids[1] and server.get("ipc") == learner.get("ipc") == "host"
            share = server_settings(server, clean_env).gpu_memory_utilization
            assert share is not None and share <= 0.5
    assert needs_gpu == wanted
    for name, svc in services_in(doc, "cpu").items():
        assert not gpu_requests(svc) and "gpus" not in svc and "runtime" not in svc, name


def test_redis_keeps_its_append_only_file_on_a_volume(doc: dict[str, Any]) -> None:
    name = redis_service(doc["services"])
    redis = doc["services"][name]
    assert not redis.get("profiles"), "Redis runs in every profile"
    assert redis["command"][0] == "sh"
    assert repo_file_for(redis, redis["command"][1]) == REDIS_START
    assert repo_file_for(redis, REDIS_CONF_IN_CONTAINER) == REPO / "docker" / "redis.conf"
    assert f'"${{GSPO_REDIS_CONF:-{REDIS_CONF_IN_CONTAINER}}}"' in REDIS_START.read_text()
    assert re.search(r"^appendonly yes$", (REPO / "docker" / "redis.conf").read_text(), re.M)
    data = mount_for(redis, "/data")
    assert data is not None and data.type == "volume" and data.source in doc["volumes"]
    # The config holding the password is written to a tmpfs, not to the data volume.
    assert "/run/redis" in redis["tmpfs"]
    # The probe authenticates (REDISCLI_AUTH) and fails on NOAUTH (redis-cli exits 0 on it).
    assert redis["healthcheck"]["test"] == ["CMD-SHELL", "redis-cli ping | grep -q PONG"]
    assert redis_password(redis)


REDIS_START = REPO / "docker" / "redis-start.sh"
REDIS_CONF_IN_CONTAINER = "/usr/local/etc/redis/redis.conf"


def redis_password(redis_svc: dict[str, Any]) -> str:
    """The password Redis is started with: from the environment (REDISCLI_AUTH, which
    docker/redis-start.sh writes into its config), never from its command line."""
    password = redis_svc["environment"]["REDISCLI_AUTH"]
    assert password, "Redis must require a password"
    assert not any(password in str(a) for a in redis_svc["command"]), \
        "the password must not be an argument (`ps`, `docker inspect`)"
    return password


@for_each_profile
def test_redis_has_a_password_only_the_server_and_the_learner_hold(
        raw: dict[str, Any], doc: dict[str, Any], profile: str,
        clean_env: pytest.MonkeyPatch) -> None:
    services = services_in(doc, profile)
    roles = roles_of(services)
    redis_name = redis_service(services)
    redis_svc = services[redis_name]
    password = redis_password(redis_svc)
    assert required_variable(raw["services"][redis_name]["environment"]["REDISCLI_AUTH"]) == \
        "GSPO_REDIS_PASSWORD", "the password comes from .env, required"
    conf = (REPO / "docker" / "redis.conf").read_text()
    assert re.search(r"^protected-mode yes$", conf, re.M)
    assert not re.search(r"^requirepass", conf, re.M), "no password in the repository"
    (_, server), (_, learner), (_, env) = (roles[r] for r in ("serve", "learn", "env"))
    s, cfg = server_settings(server, clean_env), learner_config(learner)
    for url in (s.redis_url, cfg.redis_url):
        assert urlsplit(url).password == password
    for svc in (server, learner, env):
        assert not any("redis://" in a for a in gspo_argv(svc.get("command")) or []), \
            "the Redis URL holds the password: env var, not a flag (flags show in `ps`)"
    # The environment gets nothing of Redis and shares no network with it.
    assert not any(password in str(v) for v in env.get("environment", {}).values())
    redis_nets = set(redis_svc["networks"])
    assert not redis_nets & set(env.get("networks", ["default"]))
    for svc in (server, learner):
        assert redis_nets & set(svc["networks"])
    assert set(server["networks"]) & set(env["networks"]), "the environment reaches the server"


def _start_redis(password: str, run_dir: Path, *flags: str) -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], "REDISCLI_AUTH": password,
           "GSPO_REDIS_CONF": str(REPO / "docker" / "redis.conf"),
           "GSPO_REDIS_RUN_DIR": str(run_dir)}
    return subprocess.Popen(["sh", str(REDIS_START), *flags], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_shipped_redis_refuses_clients_without_the_password(doc: dict[str, Any],
                                                            tmp_path: Path) -> None:
    """redis-server started as the compose file starts it (docker/redis-start.sh with the
    password in REDISCLI_AUTH), on a free loopback port: no password, no access; the server's
    URL gets in; the password is in no process's command line, only in a file only its owner
    reads."""
    import redis as redis_py

    from tests.conftest import free_port, wait_for_port

    password = redis_password(doc["services"][redis_service(doc["services"])])
    port = free_port()
    assert shutil.which("redis-server") is not None
    proc = _start_redis(password, tmp_path / "run", "--port", str(port), "--dir", str(tmp_path))
    try:
        wait_for_port(port, proc)
        with pytest.raises(redis_py.AuthenticationError):
            redis_py.Redis(port=port).ping()
        server_url = doc["services"]["server"]["environment"]["GSPO_REDIS_URL"]
        u = urlsplit(server_url)
        assert redis_py.Redis.from_url(
            server_url.replace(f"@{u.hostname}:{u.port}", f"@127.0.0.1:{port}")).ping()
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()  # exec'd: redis-server
        assert b"redis-server" in cmdline and password.encode() not in cmdline
        conf = tmp_path / "run" / "redis.conf"
        assert conf.stat().st_mode & 0o077 == 0, "the config with the password: owner only"
        assert f"requirepass {password}" in conf.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("password", ["", "p@ss", "a b", "x/y"])
def test_redis_start_refuses_a_password_the_urls_cannot_carry(password: str,
                                                              tmp_path: Path) -> None:
    proc = _start_redis(password, tmp_path / "run")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and b"URL-safe" in err
    assert not (tmp_path / "run" / "redis.conf").exists()


def test_cpu_learner_stops_at_the_demo_target_and_is_not_restarted(
        raw: dict[str, Any], env_values: dict[str, str], clean_env: pytest.MonkeyPatch) -> None:
    """The cpu profile trains the demo task until it is learned, at the reward `gspo up` stops
    at (issue 15: past it, whole groups score alike and are dropped): exit 0 there must not be
    restarted, and a new `up` resumes from the checkpoint. GSPO_TARGET_REWARD=0: no target."""
    def cpu_learner(values: dict[str, str]) -> tuple[dict[str, Any], LearnerConfig]:
        learner = roles_of(services_in(interpolate(raw, values), "cpu"))["learn"][1]
        return learner, learner_config(learner)

    learner, cfg = cpu_learner(env_values)
    demo_target = UpConfig.model_fields["target_reward"].default
    assert cfg.target_reward == float(env_values["GSPO_TARGET_REWARD"]) == demo_target
    assert learner["restart"] == "on-failure"  # exit 0 at the target: stays stopped
    assert cfg.resume and cfg.save_dir is not None
    env = roles_of(services_in(interpolate(raw, env_values), "cpu"))["env"][1]
    assert env["restart"] == "on-failure"  # it waits (503 training_finished), never exits
    # No target of its own: one that met it before the learner's (a window of other groups)
    # would leave the learner waiting for groups that never come.
    _, env_params = parse_gspo(gspo_argv(env["command"]) or [])
    assert env_params["target_reward"] is None
    _, off = cpu_learner({**env_values, "GSPO_TARGET_REWARD": "0"})
    assert off.target_reward == 0.0  # gspo_rl.learner.runtime.target: 0 is no target
    with pytest.raises(Exception, match="target_reward"):
        cpu_learner({**env_values, "GSPO_TARGET_REWARD": "-1"})


def test_plain_up_picks_the_profile_that_runs_anywhere(dotenv: dict[str, str]) -> None:
    """.env.example's COMPOSE_PROFILES is cpu: a plain `docker compose up` on a machine without
    GPUs must not pick a GPU profile."""
    assert dotenv["COMPOSE_PROFILES"] == "cpu"


@for_each_profile
def test_each_image_is_built_once(doc: dict[str, Any], profile: str) -> None:
    """One service per profile builds a tag; the others name it (compose skips pulling a tag
    that another service of the project builds): four builds of one tag left three untagged
    images."""
    services = services_in(doc, profile)
    builders: dict[str, list[str]] = {}
    for name, svc in services.items():
        if "build" in svc:
            builders.setdefault(svc["image"], []).append(name)
    assert all(len(names) == 1 for names in builders.values()), builders
    for name, svc in services.items():
        image = str(svc.get("image", ""))
        if image.startswith("gspo-rl:"):
            assert image in builders, f"{name} runs {image}, which no {profile} service builds"


def test_the_docs_name_real_services_in_compose_commands(raw: dict[str, Any]) -> None:
    """`docker compose logs -f learner` in the cpu profile printed nothing (its learner is
    learner-cpu) and a wrong name fails silently: every service a doc names exists."""
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    pattern = re.compile(r"docker compose(?: --profile \S+)* (?:logs|restart|stop|exec)"
                         r"((?: -{1,2}[a-z]+)*)((?: [a-z][a-z0-9-]*)+)")
    seen = 0
    for path in docs:
        for m in pattern.finditer(path.read_text()):
            for name in m.group(2).split():
                seen += 1
                assert name in raw["services"], f"{path.name}: {m.group(0)!r}"
    assert seen, "no compose command found in the docs (the pattern is wrong)"
