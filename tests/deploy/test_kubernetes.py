"""deploy/kubernetes, checked without a cluster.

Every overlay (cpu, gpu1, gpu) and extras/model-volume is rendered by ``kubectl kustomize``,
and every object it renders is validated, strictly (an unknown field fails), against the
Kubernetes JSON schemas that kubernetes-validate bundles, for Kubernetes 1.30 (the oldest
these manifests claim) and 1.37 (the newest the pinned validator knows). Nothing is fetched.

Then the pieces are checked against each other and against the project: Services select pods
and reach their named ports; URLs name Services that exist; NetworkPolicies, evaluated with
the Kubernetes rules, admit exactly what compose's networks admit (the environment reaches the
servers, never Redis or the learner); environment variables are settings the project reads;
Secrets are referenced, never committed, and exactly the ones the documentation's commands
create; no secret reaches a command line; the `gspo` command lines use flags the CLI has; the
images are the ones docker/ builds; each learner.toml is docker/'s but for the rendezvous
address, which names rank 0's pod; torchrun's shape agrees with the StatefulSet and its GPUs;
the autoscaler's metric exists and its ceiling follows the admission bound.

Nothing here imports the project's Python packages (their layout is being reorganised): the
settings' fields are read from the source with ``ast``, the flags from ``gspo COMMAND --help``.
A missing ``kubectl`` skips what needs a rendering (the file checks run anyway), a missing
``gspo`` command the flag check.
"""

from __future__ import annotations

import ast
import copy
import functools
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
DOCS = REPO / "docs" / "deployment" / "kubernetes.md"
OVERLAYS = ("cpu", "gpu1", "gpu")
EXTRAS = ("extras/model-volume",)
# The oldest Kubernetes the manifests claim (the StatefulSet pod-index label that overlays/gpu
# reads is on by default from 1.28) and the newest the pinned kubernetes-validate bundles.
K8S_VERSIONS = ("1.30", "1.37")
# The compose file's counterpart of each overlay's learner settings and services.
DOCKER_TOML = {"cpu": "docker/learner-cpu.toml", "gpu1": "docker/learner-gpu1.toml",
               "gpu": "docker/learner.toml"}
COMPOSE_SERVICES = {"cpu": ("server-cpu", "learner-cpu"), "gpu1": ("server-gpu1", "learner-gpu1"),
                    "gpu": ("server", "learner")}
GSPO_COMMANDS = ("serve", "learn", "env", "tiny-model")
# Secrets must never be passed as flags: they would show in `ps`.
SECRET_FLAGS = ("--api-key", "--admin-key", "--redis-url", "--requirepass")
BROADCAST_PORT = 41234  # any port: the weight broadcast's store and ranks pick free ones
DNS = 53

KUBECTL = shutil.which("kubectl")
# Test ids without the bare word "gpu": tests/conftest.py skips items with a "gpu" keyword on
# machines without CUDA, and nothing here needs one.
for_each_overlay = pytest.mark.parametrize("overlay", OVERLAYS,
                                           ids=[f"{o}-overlay" for o in OVERLAYS])


# ---------------------------------------------------------------------------- rendering


@functools.cache
def _render(path: str) -> tuple[dict[str, Any], ...]:
    assert KUBECTL is not None
    proc = subprocess.run([KUBECTL, "kustomize", str(K8S / path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def render(path: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize deploy/kubernetes/PATH`` renders (a fresh copy)."""
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: the manifests are rendered with "
                    "`kubectl kustomize` (kubectl >= 1.27, kustomize v5)")
    return copy.deepcopy(list(_render(path)))


def overlay_docs(overlay: str) -> list[dict[str, Any]]:
    return render(f"overlays/{overlay}")


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name!r}, found {len(found)}"
    return found[0]


def pod_templates(docs: list[dict]) -> list[tuple[dict, dict]]:
    """(workload, pod template) for every object that makes pods."""
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            out.append((d, d["spec"]["template"]))
        elif d["kind"] == "Pod":
            out.append((d, {"metadata": d["metadata"], "spec": d["spec"]}))
    return out


def containers(pod_spec: dict, init: bool = True) -> list[dict]:
    return (pod_spec.get("initContainers", []) if init else []) + pod_spec["containers"]


def argv(container: dict) -> list[str]:
    return [str(w) for w in container.get("command", []) + container.get("args", [])]


def invocations(container: dict) -> list[tuple[str, list[str]]]:
    """The ``gspo COMMAND ...`` command lines a container runs: (COMMAND, its arguments).
    Found anywhere in its argv (after torchrun's --no-python, around run-both.sh's --then)."""
    words = argv(container)
    starts = [i for i in range(len(words) - 1)
              if Path(words[i]).name == "gspo" and words[i + 1] in GSPO_COMMANDS]
    out = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(words)
        rest = words[start + 2:end]
        if "--then" in rest:
            rest = rest[:rest.index("--then")]
        out.append((words[start + 1], rest))
    return out


def options(args: list[str]) -> dict[str, str | None]:
    """``--flag value`` / ``--flag=value`` / ``--switch`` -> {flag: value or None}."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("--"):
            if "=" in word:
                key, value = word.split("=", 1)
                out[key] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[word] = args[i + 1]
                i += 1
            else:
                out[word] = None
        i += 1
    return out


def runs(docs: list[dict], command: str) -> list[tuple[dict, dict, dict, dict[str, str | None]]]:
    """(workload, pod template, container, options) of every ``gspo COMMAND`` in ``docs``."""
    out = []
    for workload, tpl in pod_templates(docs):
        for c in containers(tpl["spec"]):
            for sub, args in invocations(c):
                if sub == command:
                    out.append((workload, tpl, c, options(args)))
    return out


def the_one(docs: list[dict], command: str) -> tuple[dict, dict, dict, dict[str, str | None]]:
    found = runs(docs, command)
    assert len(found) == 1, f"expected one `gspo {command}`, found {len(found)}"
    return found[0]


def env_names(container: dict) -> list[str]:
    return [e["name"] for e in container.get("env", [])]


def env_entry(container: dict, name: str) -> dict:
    found = [e for e in container.get("env", []) if e["name"] == name]
    assert found, f"container {container['name']} has no env {name}"
    return found[0]


def volume_for(tpl: dict, workload: dict, container: dict, path: str) -> tuple[dict, str]:
    """The volume (or the StatefulSet's claim template, as {"claimTemplate": ...}) mounted at
    ``path`` or a directory above it, and its mount path."""
    mounts = sorted((m for m in container.get("volumeMounts", [])
                     if path == m["mountPath"]
                     or path.startswith(m["mountPath"].rstrip("/") + "/")),
                    key=lambda m: len(m["mountPath"]), reverse=True)
    assert mounts, f"nothing is mounted at {path} in container {container['name']}"
    name = mounts[0]["name"]
    for v in tpl["spec"].get("volumes", []):
        if v["name"] == name:
            return v, mounts[0]["mountPath"]
    for t in workload["spec"].get("volumeClaimTemplates", []):
        if t["metadata"]["name"] == name:
            return {"name": name, "claimTemplate": t}, mounts[0]["mountPath"]
    raise AssertionError(f"volume {name!r} of {container['name']} is not defined")


def gpus(container: dict) -> int:
    res = container.get("resources", {})
    limit = int(res.get("limits", {}).get("nvidia.com/gpu", 0))
    request = int(res.get("requests", {}).get("nvidia.com/gpu", limit))
    assert request == limit, f"{container['name']}: GPU requests and limits differ"
    return limit


# ---------------------------------------------------------------------------- the project


@functools.cache
def project_sources() -> tuple[Path, ...]:
    """The project's own Python files (not tests, not virtual environments)."""
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))
                   and d not in {"tests", "deploy", "runs", "node_modules", "build", "dist"}]
        found += [Path(root) / f for f in files if f.endswith(".py")]
    return tuple(sorted(found))


@functools.cache
def source_text() -> str:
    return "\n".join(p.read_text(errors="replace") for p in project_sources())


@functools.cache
def class_fields(name: str) -> dict[str, ast.expr | None]:
    """Annotated attributes of the project's class ``name`` (its settings fields), those of
    its project bases included (``LearnerConfig``'s shared field models), from the source,
    wherever the class lives now."""
    for path in project_sources():
        text = path.read_text(errors="replace")
        if f"class {name}(" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name == name:
                fields: dict[str, ast.expr | None] = {}
                for base in node.bases:
                    if isinstance(base, ast.Name) and base.id not in ("BaseModel",
                                                                      "BaseSettings"):
                        fields |= class_fields(base.id)
                return fields | {n.target.id: n.value for n in node.body
                                 if isinstance(n, ast.AnnAssign)
                                 and isinstance(n.target, ast.Name)}
    raise AssertionError(f"class {name} not found in the project's sources")


def field_default(cls: str, name: str) -> Any:
    value = class_fields(cls)[name]
    if isinstance(value, ast.Call):  # Field(default=...)
        value = next(k.value for k in value.keywords if k.arg == "default")
    return ast.literal_eval(value)


@functools.cache
def env_literals() -> frozenset[str]:
    """``GSPO_*`` names that appear as string literals in the project's code (what it reads
    outside the server's settings class: the learner's GSPO_ADMIN_KEY, the SDK's keys)."""
    return frozenset(re.findall(r"""["'](GSPO_[A-Z0-9_]+)["']""", source_text()))


def is_server_setting(name: str) -> bool:
    """``GSPO_<FIELD>`` (or ``GSPO_<FIELD>__<SUB>``) of ServerSettings (env prefix GSPO_)."""
    fields = {f"GSPO_{f.upper()}" for f in class_fields("ServerSettings")}
    return name in fields or any(name.startswith(f + "__") for f in fields)


def gspo_binary() -> Path | None:
    here = Path(sys.executable).with_name("gspo")
    return here if here.exists() else (Path(p) if (p := shutil.which("gspo")) else None)


@functools.cache
def cli_flags(program: str, *sub: str) -> frozenset[str]:
    """Every ``--flag`` that ``PROGRAM SUB --help`` lists."""
    env = dict(os.environ, COLUMNS="300", TERM="dumb", NO_COLOR="1")
    proc = subprocess.run([program, *sub, "--help"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return frozenset(re.findall(r"--[a-z0-9][a-z0-9_-]*", proc.stdout))


@functools.cache
def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def compose_images() -> dict[str, str]:
    """overlay kind -> image: what docker-compose.yml builds (checked to exist) and runs."""
    doc = compose()
    out = {}
    for kind in ("cpu", "gpu"):
        image = doc[f"x-{kind}-image"]
        assert (REPO / image["build"]["dockerfile"]).is_file()
        out[kind] = image["image"]
    out["redis"] = doc["services"]["redis"]["image"]
    return out


def seconds(duration: str) -> int:
    """A compose duration ("2m", "45s", "1m30s") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+)([hms])", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * units[u] for n, u in parts)


def conf_directives(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def learner_toml(overlay: str) -> dict[str, Any]:
    return tomllib.loads((K8S / "overlays" / overlay / "learner.toml").read_text())


@functools.cache
def documented_secrets() -> dict[str, frozenset[str]]:
    """The Secrets the documentation's `kubectl create secret` commands make: run each, as
    written, with --dry-run=client (no cluster), and validate what it would create."""
    text = DOCS.read_text()
    commands = re.findall(r"^kubectl -n \S+ create secret generic .*$", text, re.M)
    assert commands, f"{DOCS} has no `kubectl -n NS create secret generic` command"
    secrets: dict[str, frozenset[str]] = {}
    for command in commands:
        if KUBECTL is None:
            name = re.search(r"secret generic (\S+)", command)[1]
            keys = re.findall(r"--from-literal=([^=\s]+)=", command)
            secrets[name] = frozenset(keys)
            continue
        proc = subprocess.run(["bash", "-c", command + " --dry-run=client -o yaml"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{command}\n{proc.stderr}"
        secret = yaml.safe_load(proc.stdout)
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(secret, version, strict=True)
        assert all(secret["data"].values()), f"empty value from: {command}"
        secrets[secret["metadata"]["name"]] = frozenset(secret["data"])
    return secrets


# ---------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("path", [f"overlays/{o}" for o in OVERLAYS] + list(EXTRAS),
                         ids=[f"{o}-overlay" for o in OVERLAYS] + ["model-volume"])
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_renders_and_validates_against_the_kubernetes_schemas(path: str, version: str) -> None:
    docs = render(path)
    assert docs
    seen = set()
    for doc in docs:
        key = (doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"])
        assert key not in seen, f"{key} rendered twice"
        seen.add(key)
        # SchemaNotFoundError (a kind without a bundled schema, e.g. a CRD) fails too.
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(map(str, exc.path))
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} ({path}) is not valid "
                        f"Kubernetes {version}: {where}: {exc.message}")


def test_the_validator_rejects_what_it_should() -> None:
    docs = overlay_docs("cpu")
    server = copy.deepcopy(named(docs, "Deployment", "server"))
    kubernetes_validate.validate(server, K8S_VERSIONS[0], strict=True)
    typo = copy.deepcopy(server)
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSIONS[0], strict=True)
    wrong_type = copy.deepcopy(server)
    wrong_type["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, K8S_VERSIONS[0], strict=True)
    crd = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"}}
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(crd, K8S_VERSIONS[-1], strict=True)


@for_each_overlay
def test_everything_lives_in_the_overlays_namespace(overlay: str) -> None:
    docs = overlay_docs(overlay)
    [namespace] = of_kind(docs, "Namespace")
    name = namespace["metadata"]["name"]
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == name, doc["metadata"]["name"]
    assert not of_kind(docs, "Secret"), "Secrets are created by the user, never committed"


# ---------------------------------------------------------------------------- wiring


@for_each_overlay
def test_services_select_pods_and_reach_their_ports(overlay: str) -> None:
    docs = overlay_docs(overlay)
    for svc in of_kind(docs, "Service"):
        selector = svc["spec"]["selector"]
        pods = [tpl for _, tpl in pod_templates(docs)
                if all(tpl["metadata"]["labels"].get(k) == v for k, v in selector.items())]
        assert pods, f"Service {svc['metadata']['name']} selects no pod"
        for port in svc["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            for tpl in pods:
                declared = [p for c in containers(tpl["spec"], init=False)
                            for p in c.get("ports", [])]
                match = [p for p in declared
                         if (p.get("name") == target if isinstance(target, str)
                             else p["containerPort"] == target)]
                assert match, (f"Service {svc['metadata']['name']} port {port['port']} -> "
                               f"{target!r}: no such container port in a pod it selects")
                assert match[0].get("protocol", "TCP") == port.get("protocol", "TCP")


@for_each_overlay
def test_urls_name_services_and_ports_that_exist(overlay: str) -> None:
    docs = overlay_docs(overlay)
    ports = {(s["metadata"]["name"], p["port"]) for s in of_kind(docs, "Service")
             for p in s["spec"].get("ports", [])}
    found = 0
    for _, tpl in pod_templates(docs):
        for c in containers(tpl["spec"]):
            texts = argv(c) + [e.get("value", "") for e in c.get("env", [])]
            for text in texts:
                for host, port in re.findall(r"(?:https?|redis)://(?:[^@/\s]*@)?"
                                             r"([a-z][a-z0-9-]*):(\d+)", text):
                    found += 1
                    assert (host, int(port)) in ports, f"{text}: no Service {host}:{port}"
    assert found >= 3  # the servers' and the learner's Redis, the environment's server


@for_each_overlay
def test_every_variable_reference_is_defined(overlay: str) -> None:
    """Kubernetes leaves an undefined $(VAR) as it is, silently: a typo would reach the
    program as the literal text."""
    docs = overlay_docs(overlay)
    for _, tpl in pod_templates(docs):
        for c in containers(tpl["spec"]):
            names = env_names(c)
            for i, entry in enumerate(c.get("env", [])):
                for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", entry.get("value", "")):
                    assert ref in names[:i], f"{c['name']}: {entry['name']} uses $({ref}) " \
                                             "before it is defined"
            for word in argv(c):
                for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", word):
                    assert ref in names, f"{c['name']}: $({ref}) is not an env var"


@for_each_overlay
def test_environment_variables_are_settings_the_project_reads(overlay: str) -> None:
    docs = overlay_docs(overlay)
    checked = 0
    for _, tpl in pod_templates(docs):
        for c in containers(tpl["spec"]):
            commands = {sub for sub, _ in invocations(c)}
            for name in env_names(c):
                if not name.startswith("GSPO_"):
                    continue
                checked += 1
                if "serve" in commands:
                    assert is_server_setting(name), f"{name} is no ServerSettings field"
                else:
                    assert name in env_literals(), f"{c['name']}: nothing reads {name}"
    assert checked
    for *_, c, _ in runs(docs, "serve"):
        assert {"GSPO_API_KEY", "GSPO_ADMIN_KEY", "GSPO_REDIS_URL"} <= set(env_names(c))
    for *_, c, _ in runs(docs, "learn"):
        assert {"GSPO_ADMIN_KEY", "GSPO_REDIS_URL"} <= set(env_names(c))
    for _, tpl, c, _ in runs(docs, "env"):
        # The environment holds the API key and nothing that opens Redis or the admin routes.
        assert set(env_names(c)) & {"GSPO_API_KEY", "GSPO_ADMIN_KEY", "GSPO_REDIS_URL"} \
            == {"GSPO_API_KEY"}
        refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {})}
        assert refs == {"gspo-api-key"}
        assert not any("secret" in v for v in tpl["spec"].get("volumes", []))
    for *_, c, _ in runs(docs, "serve") + runs(docs, "learn"):
        url = env_entry(c, "GSPO_REDIS_URL")["value"]
        assert re.fullmatch(r"redis://:\$\(REDIS_PASSWORD\)@redis:\d+/\d+", url), url
        ref = env_entry(c, "REDIS_PASSWORD")["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("gspo-redis", "password")


@for_each_overlay
def test_secrets_are_the_documented_ones_and_never_on_a_command_line(overlay: str) -> None:
    docs = overlay_docs(overlay)
    documented = documented_secrets()
    used = set()
    for _, tpl in pod_templates(docs):
        for v in tpl["spec"].get("volumes", []):
            if "secret" in v:
                keys = {i["key"] for i in v["secret"].get("items", [])}
                assert keys, "mount Secret keys by name (items): the documentation lists them"
                used |= {(v["secret"]["secretName"], k) for k in keys}
        for c in containers(tpl["spec"]):
            secret_envs = set()
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    used.add((ref["name"], ref["key"]))
                    secret_envs.add(e["name"])
            words = argv(c)
            for word in words:
                leaked = set(re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", word)) & secret_envs
                assert not leaked, f"{c['name']}: secret {leaked} on its command line (ps)"
            for sub, args in invocations(c):
                assert not set(options(args)) & set(SECRET_FLAGS), f"gspo {sub}: secret flag"
            assert not any(w.startswith("--requirepass") for w in words)
    assert used
    for name, key in used:
        assert key in documented.get(name, ()), \
            f"Secret {name} (key {key}) is not created by {DOCS.relative_to(REPO)}"


def test_every_documented_secret_is_used() -> None:
    used = set()
    for overlay in OVERLAYS:
        for _, tpl in pod_templates(overlay_docs(overlay)):
            for c in containers(tpl["spec"]):
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        used.add((ref["name"], ref["key"]))
    documented = {(n, k) for n, keys in documented_secrets().items() for k in keys}
    assert documented == used


@for_each_overlay
def test_gspo_command_lines_use_flags_the_cli_has(overlay: str) -> None:
    docs = overlay_docs(overlay)
    gspo = gspo_binary()
    if gspo is None:
        pytest.skip("the gspo command is not installed (bash scripts/setup.sh)")
    checked = 0
    for _, tpl in pod_templates(docs):
        for c in containers(tpl["spec"]):
            for sub, args in invocations(c):
                unknown = set(options(args)) - cli_flags(str(gspo), sub)
                assert not unknown, f"gspo {sub}: no such flags {sorted(unknown)}"
                checked += 1
            if c.get("command", [None])[0] == "torchrun":
                torchrun = Path(sys.executable).with_name("torchrun")
                words = argv(c)[1:]
                own = words[:words.index("--no-python")]
                if torchrun.exists():
                    unknown = set(options(own)) - cli_flags(str(torchrun))
                    assert not unknown, f"torchrun: no such flags {sorted(unknown)}"
    assert checked >= 3


@for_each_overlay
def test_images_are_the_ones_docker_builds(overlay: str) -> None:
    docs = overlay_docs(overlay)
    images = compose_images()
    gspo_image = images["cpu" if overlay == "cpu" else "gpu"]
    for workload, tpl in pod_templates(docs):
        for c in containers(tpl["spec"]):
            if workload["metadata"]["name"] == "redis":
                assert c["image"] == images["redis"], c["name"]
            else:
                assert c["image"] == gspo_image, f"{workload['metadata']['name']}: {c['image']}"


# ---------------------------------------------------------------------------- the learner


@for_each_overlay
def test_learner_settings_are_dockers_but_the_rendezvous(overlay: str) -> None:
    ours = learner_toml(overlay)
    theirs = tomllib.loads((REPO / DOCKER_TOML[overlay]).read_text())
    assert {k: v for k, v in ours.items() if k != "sync_master_addr"} == \
        {k: v for k, v in theirs.items() if k != "sync_master_addr"}
    assert ours["sync_master_addr"] != theirs["sync_master_addr"]
    assert set(ours) <= set(class_fields("LearnerConfig")), "unknown LearnerConfig fields"
    assert set(ours.get("loss", {})) <= set(class_fields("LossConfig"))


@for_each_overlay
def test_learner_config_is_mounted_where_the_command_reads_it(overlay: str) -> None:
    docs = overlay_docs(overlay)
    workload, tpl, c, opts = the_one(docs, "learn")
    path = Path(opts["--config"])
    volume, mount = volume_for(tpl, workload, c, str(path))
    configmap = named(docs, "ConfigMap", volume["configMap"]["name"])
    key = str(path.relative_to(mount))
    assert configmap["data"][key] == (K8S / "overlays" / overlay / "learner.toml").read_text()


@for_each_overlay
def test_rendezvous_address_names_rank_0s_pod(overlay: str) -> None:
    """sync_master_addr is learner-0's stable name under the learner's headless Service, and
    global rank 0 (which hosts the weight broadcast) runs on learner-0."""
    docs = overlay_docs(overlay)
    workload, tpl, c, _ = the_one(docs, "learn")
    assert workload["kind"] == "StatefulSet"
    service = named(docs, "Service", workload["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    labels = tpl["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    host = learner_toml(overlay)["sync_master_addr"]
    assert host == f"{workload['metadata']['name']}-0.{service['metadata']['name']}"
    replicas = workload["spec"]["replicas"]
    if c["command"][0] != "torchrun":
        assert replicas == 1, "two learner processes would both consume the queue"
        return
    words = argv(c)[1:]
    torchrun = options(words[:words.index("--no-python")])
    assert int(torchrun["--nnodes"]) == replicas
    assert int(torchrun["--nproc-per-node"]) == gpus(c)
    assert torchrun["--master-addr"] == host  # static rendezvous: node 0 holds rank 0
    assert torchrun["--node-rank"] == "$(POD_INDEX)"
    assert env_entry(c, "POD_INDEX")["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    port = int(torchrun["--master-port"])
    named_port = [p["name"] for p in c["ports"] if p["containerPort"] == port]
    assert named_port
    assert any(p.get("targetPort") == named_port[0] for p in service["spec"]["ports"])
    assert workload["spec"]["podManagementPolicy"] == "Parallel"


@for_each_overlay
def test_checkpoints_are_on_a_volume_every_rank_can_read_and_resume(overlay: str) -> None:
    docs = overlay_docs(overlay)
    workload, tpl, c, opts = the_one(docs, "learn")
    assert "--resume" in opts and opts["--weight-sync"] == "broadcast"
    volume, _ = volume_for(tpl, workload, c, opts["--save-dir"])
    if workload["spec"]["replicas"] == 1:
        assert "claimTemplate" in volume or "persistentVolumeClaim" in volume
        return
    # Ranks > 0 load the checkpoint from the same path when they resume (learner/follower.py):
    # one claim, mounted by every pod, on storage many nodes can mount.
    claim = named(docs, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert "ReadWriteMany" in claim["spec"]["accessModes"]


@for_each_overlay
def test_every_claim_a_pod_mounts_is_defined(overlay: str) -> None:
    docs = overlay_docs(overlay)
    defined = {d["metadata"]["name"] for path in (f"overlays/{overlay}", *EXTRAS)
               for d in of_kind(render(path), "PersistentVolumeClaim")}
    for workload, tpl in pod_templates(docs):
        for v in tpl["spec"].get("volumes", []):
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                assert claim in defined, f"{workload['metadata']['name']}: claim {claim}"
                assert claim in DOCS.read_text()


# ---------------------------------------------------------------------------- server + learner


@for_each_overlay
def test_servers_and_learner_agree(overlay: str) -> None:
    docs = overlay_docs(overlay)
    serves, learns = runs(docs, "serve"), runs(docs, "learn")
    assert serves and len(learns) == 1
    l_workload, l_tpl, l_c, learn = learns[0]
    toml = learner_toml(overlay)
    for workload, tpl, c, serve in serves:
        assert serve.get("--key-prefix") == learn.get("--key-prefix")
        assert serve["--model"] == learn["--model"]
        volume_for(tpl, workload, c, serve["--model"])
        # Every replica registers its own address: the learner must reach each one, not
        # whichever the Service picks.
        port = int(serve["--port"])
        assert serve["--host"] == "0.0.0.0"
        assert serve["--advertise-url"] == f"http://$(POD_IP):{port}"
        assert env_entry(c, "POD_IP")["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert serve["--server-id"] == "$(POD_NAME)"
        assert env_entry(c, "POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.name"
        assert {"name": "http", "containerPort": port, "protocol": "TCP"} in c["ports"]
        engine = serve["--engine"]
        if overlay == "cpu":
            assert (engine, serve["--device"]) == ("hf", "cpu")
        else:
            assert engine == "vllm"
    volume_for(l_tpl, l_workload, l_c, learn["--model"])
    cpu = overlay == "cpu"
    assert learn["--device"] == ("cpu" if cpu else "cuda")
    assert toml["sync_backend"] == ("gloo" if overlay != "gpu" else "nccl")
    if cpu:
        # Each pod makes the tiny model itself (same seed, same bytes) before its program.
        for _, tpl, _, opts in serves + learns:
            made = [args[0] for i in tpl["spec"].get("initContainers", [])
                    for sub, args in invocations(i) if sub == "tiny-model"]
            assert made == [opts["--model"]]


@for_each_overlay
def test_gpus(overlay: str) -> None:
    docs = overlay_docs(overlay)
    requested = {(w["metadata"]["name"], c["name"]): gpus(c)
                 for w, tpl in pod_templates(docs) for c in containers(tpl["spec"])}
    if overlay == "cpu":
        assert not any(requested.values())
        return
    if overlay == "gpu1":
        # One GPU for the pair: CUDA IPC needs server and learner on the same device.
        assert sorted(v for v in requested.values() if v) == [1]
        [(workload, tpl, c, serve)] = runs(docs, "serve")
        assert [c] == [x for *_, x, _ in runs(docs, "learn")], "not in one container"
        assert 0 < float(serve["--gpu-memory-utilization"]) < 1
        assert not of_kind(docs, "HorizontalPodAutoscaler")
        return
    for *_, c, _ in runs(docs, "serve"):
        assert gpus(c) == 1
    for *_, c, _ in runs(docs, "learn"):
        assert gpus(c) >= 1
    for w, tpl in pod_templates(docs):
        if any(gpus(c) for c in containers(tpl["spec"])):
            spec = tpl["spec"]
            assert any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", []))
            shm = [m for c in containers(spec) for m in c.get("volumeMounts", [])
                   if m["mountPath"] == "/dev/shm"]
            assert shm, f"{w['metadata']['name']}: no /dev/shm for NCCL"


@for_each_overlay
def test_server_probes_and_graceful_stop(overlay: str) -> None:
    docs = overlay_docs(overlay)
    uvicorn = re.search(r"timeout_graceful_shutdown=(\d+)", source_text())
    assert uvicorn, "the server's graceful shutdown timeout is no longer where it was"
    server_service, learner_service = COMPOSE_SERVICES[overlay]
    services = compose()["services"]
    for _, tpl, c, serve in runs(docs, "serve"):
        http = next(p for p in c["ports"] if p["containerPort"] == int(serve["--port"]))
        for probe in ("startupProbe", "readinessProbe"):
            get = c[probe]["httpGet"]
            assert get["path"] == "/health" and get["port"] in (http["name"], http["containerPort"])
        # Liveness must not depend on Redis (/health turns 503 while Redis is down).
        assert c["livenessProbe"]["httpGet"]["path"] == "/metrics"
        pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
        assert pre_stop[0] == "sleep"
        grace = tpl["spec"]["terminationGracePeriodSeconds"]
        assert grace >= int(pre_stop[1]) + int(uvicorn[1])
        assert grace >= seconds(services[server_service]["stop_grace_period"])
    for _, tpl, _, _ in runs(docs, "learn"):
        grace = tpl["spec"]["terminationGracePeriodSeconds"]
        assert grace >= seconds(services[learner_service]["stop_grace_period"])
    for _, tpl in pod_templates(docs):
        if runs([{"kind": "Pod", "metadata": tpl["metadata"], "spec": tpl["spec"]}], "serve"):
            # compose's `init: true`: the pause process reaps vLLM's worker processes.
            assert tpl["spec"]["shareProcessNamespace"] is True


# ---------------------------------------------------------------------------- Redis


@for_each_overlay
def test_redis_keeps_its_append_only_file_and_reads_its_password_from_a_file(
        overlay: str) -> None:
    docs = overlay_docs(overlay)
    redis = named(docs, "StatefulSet", "redis")
    assert redis["spec"]["replicas"] == 1
    tpl = redis["spec"]["template"]
    [main] = tpl["spec"]["containers"]
    [init] = tpl["spec"]["initContainers"]
    assert main["args"][0] == "redis-server" and len(main["args"]) == 2, \
        "nothing but the config file on redis-server's command line"
    conf = main["args"][1]
    run_volume, run_mount = volume_for(tpl, redis, main, conf)
    assert run_volume["emptyDir"]["medium"] == "Memory"  # the password never touches a disk
    assert any(m["name"] == run_volume["name"] and m["mountPath"] == run_mount
               and not m.get("readOnly") for m in init["volumeMounts"])
    script = init["command"][-1]
    assert f"> {conf}" in script and "requirepass" in script
    assert not any("secretKeyRef" in e.get("valueFrom", {}) for e in init.get("env", []))
    secret_file = re.search(r"\$\(cat (\S+)\)", script)[1]
    secret_volume, _ = volume_for(tpl, redis, init, secret_file)
    assert secret_volume["secret"]["secretName"] == "gspo-redis"
    data_volume, data_mount = volume_for(tpl, redis, main, main["workingDir"] + "/")
    assert "claimTemplate" in data_volume and data_mount == main["workingDir"]
    # The base config is docker/redis.conf's directives (AOF, noeviction), as a ConfigMap.
    ours = (K8S / "base" / "redis.conf").read_text()
    assert conf_directives(ours) == conf_directives((REPO / "docker/redis.conf").read_text())
    assert ["appendonly", "yes"] in conf_directives(ours)
    base_volume, base_mount = volume_for(tpl, redis, init, "/etc/redis-base/redis.conf")
    assert f"cat {base_mount}/redis.conf" in script
    assert named(docs, "ConfigMap", base_volume["configMap"]["name"])["data"]["redis.conf"] == ours
    assert compose()["services"]["redis"]["image"] == main["image"] == init["image"]


def test_redis_init_script_writes_the_password_and_refuses_unsafe_ones(tmp_path: Path) -> None:
    """Run the init container's script here, with its paths moved to a temporary directory."""
    docs = overlay_docs("cpu")
    init = named(docs, "StatefulSet", "redis")["spec"]["template"]["spec"]["initContainers"][0]
    script = init["command"][-1]
    (tmp_path / "base").mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "base" / "redis.conf").write_text((K8S / "base" / "redis.conf").read_text())
    moved = (script.replace("/etc/redis-base", str(tmp_path / "base"))
             .replace("/etc/redis-secret", str(tmp_path / "secret"))
             .replace("/run/redis", str(tmp_path / "run")))
    env = dict(os.environ, REDIS_MEMORY_LIMIT=str(2 * 1024**3))

    def run(password: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / "secret" / "password").write_text(password)
        return subprocess.run(["sh", "-c", moved], capture_output=True, text=True, env=env,
                              timeout=30)

    assert run("s3cret-Token_0.9~").returncode == 0
    written = conf_directives((tmp_path / "run" / "redis.conf").read_text())
    assert ["requirepass", "s3cret-Token_0.9~"] in written
    assert ["maxmemory", str(2 * 1024**3 // 10 * 7)] in written
    assert (tmp_path / "run" / "redis.conf").stat().st_mode & 0o077 == 0
    for bad in ("", "with space", "a@b", "x/y"):
        assert run(bad).returncode != 0, bad


# ---------------------------------------------------------------------------- NetworkPolicies


@dataclass(frozen=True)
class Endpoint:
    name: str
    namespace: str
    labels: dict[str, str]
    namespace_labels: dict[str, str]
    ports: dict[str, tuple[int, str]] = field(default_factory=dict)


def selects(selector: dict | None, labels: dict[str, str]) -> bool:
    selector = selector or {}
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if ((op == "In" and labels.get(key) not in values)
                or (op == "NotIn" and key in labels and labels[key] in values)
                or (op == "Exists" and key not in labels)
                or (op == "DoesNotExist" and key in labels)):
            return False
    return True


def _peer(peer: dict, policy_namespace: str, other: Endpoint) -> bool:
    if "ipBlock" in peer:
        return False  # pods are matched by selectors here
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], other.namespace_labels)
    else:
        in_namespace = other.namespace == policy_namespace
    return in_namespace and selects(peer.get("podSelector"), other.labels)


def _port(ports: list | None, port: int, protocol: str, dst: Endpoint) -> bool:
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        want = p.get("port")
        if want is None:
            return True
        if isinstance(want, str):
            if dst.ports.get(want) == (port, protocol):
                return True
        elif want <= port <= p.get("endPort", want):
            return True
    return False


def _types(policy: dict) -> list[str]:
    spec = policy["spec"]
    return spec.get("policyTypes") or ["Ingress"] + (["Egress"] if "egress" in spec else [])


def allowed(policies: list[dict], src: Endpoint, dst: Endpoint, port: int,
            protocol: str = "TCP") -> bool:
    """Whether NetworkPolicies let ``src`` open ``dst:port`` (both sides' policies)."""
    for direction, subject, other, rules, peers in (("Ingress", dst, src, "ingress", "from"),
                                                    ("Egress", src, dst, "egress", "to")):
        chosen = [p for p in policies if p["metadata"]["namespace"] == subject.namespace
                  and direction in _types(p) and selects(p["spec"]["podSelector"],
                                                         subject.labels)]
        if chosen and not any(
                (not rule.get(peers) or any(_peer(x, p["metadata"]["namespace"], other)
                                            for x in rule[peers]))
                and _port(rule.get("ports"), port, protocol, dst)
                for p in chosen for rule in p["spec"].get(rules) or []):
            return False
    return True


def endpoints(docs: list[dict]) -> dict[str, list[Endpoint]]:
    """The pods of each role, by what they run (not by their labels), plus outsiders."""
    [ns] = of_kind(docs, "Namespace")
    name = ns["metadata"]["name"]
    ns_labels = {**ns["metadata"].get("labels", {}), "kubernetes.io/metadata.name": name}
    roles: dict[str, list[Endpoint]] = {"redis": [], "server": [], "learner": [],
                                        "environment": []}
    for workload, tpl in pod_templates(docs):
        ports = {p["name"]: (p["containerPort"], p.get("protocol", "TCP"))
                 for c in containers(tpl["spec"], init=False) for p in c.get("ports", [])}
        ep = Endpoint(workload["metadata"]["name"], name, tpl["metadata"]["labels"], ns_labels,
                      ports)
        commands = {sub for c in containers(tpl["spec"]) for sub, _ in invocations(c)}
        if workload["metadata"]["name"] == "redis":
            roles["redis"].append(ep)
        for command, role in (("serve", "server"), ("learn", "learner"), ("env", "environment")):
            if command in commands:
                roles[role].append(ep)
    assert all(roles.values()), {k: len(v) for k, v in roles.items()}
    roles["stranger"] = [Endpoint("stranger", name, {"app": "other"}, ns_labels)]
    roles["prometheus"] = [Endpoint("prometheus", "monitoring", {"app": "prometheus"},
                                    {"kubernetes.io/metadata.name": "monitoring"})]
    roles["server-label-elsewhere"] = [Endpoint("impostor", "elsewhere", {
        "gspo-rl/server": "true", "gspo-rl/learner": "true"},
        {"kubernetes.io/metadata.name": "elsewhere"})]
    roles["dns"] = [Endpoint("coredns", "kube-system", {"k8s-app": "kube-dns"},
                             {"kubernetes.io/metadata.name": "kube-system"})]
    return roles


def connectivity_problems(docs: list[dict]) -> list[str]:
    """What the NetworkPolicies get wrong against compose's networks (empty: nothing)."""
    policies = of_kind(docs, "NetworkPolicy")
    roles = endpoints(docs)
    redis_port = roles["redis"][0].ports["redis"][0]
    http = roles["server"][0].ports["http"][0]
    rdzv = 29500
    expected: list[tuple[str, str, int, str, bool]] = [
        ("server", "redis", redis_port, "TCP", True),
        ("learner", "redis", redis_port, "TCP", True),
        ("environment", "server", http, "TCP", True),
        ("learner", "server", http, "TCP", True),             # admin routes
        ("learner", "server", BROADCAST_PORT, "TCP", True),   # the broadcast's ranks
        ("server", "learner", BROADCAST_PORT, "TCP", True),   # its rendezvous store
        ("server", "server", BROADCAST_PORT, "TCP", True),    # gloo/NCCL connect every pair
        ("learner", "learner", rdzv, "TCP", True),             # torchrun
        ("learner", "learner", BROADCAST_PORT, "TCP", True),
        ("prometheus", "server", http, "TCP", True),
        ("server", "dns", DNS, "UDP", True),
        ("learner", "dns", DNS, "UDP", True),
        # What compose's `backend` network keeps out:
        ("environment", "redis", redis_port, "TCP", False),
        ("environment", "learner", BROADCAST_PORT, "TCP", False),
        ("environment", "learner", rdzv, "TCP", False),
        ("environment", "server", BROADCAST_PORT, "TCP", False),
        ("stranger", "redis", redis_port, "TCP", False),
        ("stranger", "server", http, "TCP", False),
        ("stranger", "learner", BROADCAST_PORT, "TCP", False),
        ("prometheus", "redis", redis_port, "TCP", False),
        ("server-label-elsewhere", "redis", redis_port, "TCP", False),
        ("redis", "server", http, "TCP", False),              # Redis reaches nothing
        ("redis", "dns", DNS, "UDP", False),
    ]
    problems = []
    for src_role, dst_role, port, protocol, want in expected:
        for src in roles[src_role]:
            for dst in roles[dst_role]:
                if allowed(policies, src, dst, port, protocol) != want:
                    problems.append(f"{src_role} ({src.name}) -> {dst_role} ({dst.name}) "
                                    f"{port}/{protocol}: {'denied' if want else 'allowed'}")
    return problems


@for_each_overlay
def test_network_policies_admit_what_compose_networks_admit(overlay: str) -> None:
    docs = overlay_docs(overlay)
    assert connectivity_problems(docs) == []
    for policy in of_kind(docs, "NetworkPolicy"):
        spec = policy["spec"]
        pods = [tpl for _, tpl in pod_templates(docs)
                if selects(spec["podSelector"], tpl["metadata"]["labels"])]
        assert pods, f"NetworkPolicy {policy['metadata']['name']} selects no pod"
        for rule in spec.get("ingress", []) + spec.get("egress", []):
            for peer in rule.get("from", []) + rule.get("to", []):
                if "podSelector" in peer and "namespaceSelector" not in peer:
                    assert any(selects(peer["podSelector"], tpl["metadata"]["labels"])
                               for _, tpl in pod_templates(docs)), \
                        f"{policy['metadata']['name']}: a peer selects no pod"


def test_the_policy_check_finds_a_hole() -> None:
    docs = overlay_docs("cpu")
    redis = named(docs, "NetworkPolicy", "redis")
    redis["spec"]["ingress"][0]["from"].append(
        {"podSelector": {"matchLabels": {"gspo-rl/environment": "true"}}})
    assert any(p.startswith("environment") and "redis" in p for p in connectivity_problems(docs))
    docs = overlay_docs("cpu")
    named(docs, "NetworkPolicy", "learner")["spec"]["ingress"][0]["ports"] = [{"port": 29500}]
    assert any(p.startswith("server") and "learner" in p for p in connectivity_problems(docs))
    docs = [d for d in overlay_docs("cpu") if d["metadata"]["name"] != "default-deny-ingress"]
    named(docs, "NetworkPolicy", "learner")["spec"]["policyTypes"] = ["Egress"]
    assert any(p.startswith("environment") and "learner" in p
               for p in connectivity_problems(docs))


# ---------------------------------------------------------------------------- autoscaling


def test_autoscaler_scales_servers_on_a_metric_they_export_within_the_admission_bound() -> None:
    docs = overlay_docs("gpu")
    [hpa] = of_kind(docs, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    deployment = named(docs, target["kind"], target["name"])
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    assert runs([deployment], "serve")
    values = yaml.safe_load((K8S / "components/autoscaling/prometheus-adapter-values.yaml")
                            .read_text())
    served = {rule["name"]["as"] for rule in values["rules"]["custom"]}
    for rule in values["rules"]["custom"]:
        series = re.match(r"([a-z_]+)\{", rule["seriesQuery"])[1]
        assert re.search(rf"""["']{series.removesuffix('_total')}["']""", source_text()), \
            f"the server exports no {series}"
    metrics = hpa["spec"]["metrics"]
    assert metrics
    for m in metrics:
        assert m["type"] == "Pods"
        assert m["pods"]["metric"]["name"] in served
    # More servers than this cannot all be busy: admission lets at most
    # (max_staleness + 1) x groups_per_step groups be in flight (server/admission.py).
    toml = learner_toml("gpu")
    *_, env = the_one(docs, "env")
    *_, serve = the_one(docs, "serve")
    batch = int(serve.get("--max-batch-size") or field_default("ServerSettings",
                                                                "max_batch_size"))
    sequences = (toml["max_staleness"] + 1) * toml["groups_per_step"] * int(env["--group-size"])
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"] \
        <= math.ceil(sequences / batch)


# ---------------------------------------------------------------------------- gpu1's pair

FAKE_SERVER = """
import http.server, signal, sys, time
log, port = sys.argv[1], int(sys.argv[2])
def stop(*_):
    open(log, "a").write("server TERM\\n")
    time.sleep(1)  # finishing requests in flight: a second SIGTERM now would abort it
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
time.sleep(0.3)  # the script polls before the server is up
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""
FAKE_LEARNER = """
import signal, sys, time
log, mode = sys.argv[1], sys.argv[2]
def stop(*_):
    open(log, "a").write("learner TERM\\n")
    time.sleep(1)  # checkpointing
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(log, "a").write("learner started\\n")
if mode == "fail":
    sys.exit(75)  # what a learner without Redis exits with
time.sleep(60)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_both(tmp_path: Path, server: list[str], learner_mode: str) -> subprocess.Popen[str]:
    port = _free_port()
    log = tmp_path / "log"
    (tmp_path / "server.py").write_text(FAKE_SERVER)
    (tmp_path / "learner.py").write_text(FAKE_LEARNER)
    server = [w.replace("SERVER", str(tmp_path / "server.py")).replace("LOG", str(log))
              .replace("PORT", str(port)) for w in server]
    return subprocess.Popen(
        ["bash", str(K8S / "overlays" / "gpu1" / "run-both.sh"), *server, "--then",
         sys.executable, str(tmp_path / "learner.py"), str(log), learner_mode],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, HEALTH_URL=f"http://127.0.0.1:{port}/health", HEALTH_POLL_S="0.1"))


def _log(tmp_path: Path) -> list[str]:
    path = tmp_path / "log"
    return path.read_text().splitlines() if path.exists() else []


def test_run_both_stops_the_server_when_the_learner_exits(tmp_path: Path) -> None:
    """overlays/gpu1/run-both.sh: the learner starts once the server's /health answers; when
    it exits, the server gets one SIGTERM and the script exits with the learner's status (the
    kubelet restarts the pair)."""
    proc = _run_both(tmp_path, [sys.executable, "SERVER", "LOG", "PORT"], "fail")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 75, out
    assert _log(tmp_path) == ["learner started", "server TERM"]


def test_run_both_passes_one_sigterm_to_each(tmp_path: Path) -> None:
    """A second SIGTERM would make uvicorn and the learner abort instead of stopping."""
    import signal
    import time

    proc = _run_both(tmp_path, [sys.executable, "SERVER", "LOG", "PORT"], "run")
    deadline = time.monotonic() + 30
    while "learner started" not in _log(tmp_path):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert sorted(_log(tmp_path)) == ["learner TERM", "learner started", "server TERM"], out


def test_run_both_never_starts_the_learner_without_a_healthy_server(tmp_path: Path) -> None:
    proc = _run_both(tmp_path, [sys.executable, "-c", "import sys; sys.exit(4)"], "run")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 4, out
    assert _log(tmp_path) == []


def test_run_both_is_what_the_gpu1_pod_runs() -> None:
    docs = overlay_docs("gpu1")
    [(workload, tpl, c, _)] = runs(docs, "learn")
    assert c["command"][0] == "bash"
    script = Path(c["command"][1])
    volume, mount = volume_for(tpl, workload, c, str(script))
    configmap = named(docs, "ConfigMap", volume["configMap"]["name"])
    assert configmap["data"][str(script.relative_to(mount))] == \
        (K8S / "overlays" / "gpu1" / "run-both.sh").read_text()
    assert c["args"].count("--then") == 1
    health = env_entry(c, "HEALTH_URL")["value"]
    *_, serve = the_one(docs, "serve")
    assert health == f"http://127.0.0.1:{serve['--port']}/health"


# ---------------------------------------------------------------------------- the docs


def test_the_deployment_page_covers_what_it_must() -> None:
    text = DOCS.read_text()
    for overlay in OVERLAYS:
        assert f"kubectl apply -k deploy/kubernetes/overlays/{overlay}" in text
    for port in ("6379", "8000", "29500"):
        assert port in text
    for version in K8S_VERSIONS:
        assert version in text
    for words in ("kubernetes-validate", "NetworkPolic", "prometheus-adapter", "torchrun",
                  "What ran", "did not run"):
        assert words in text, words
