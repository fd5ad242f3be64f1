"""The monitoring profile (deploy/monitoring, docker-compose.yml), checked without Docker.

Every metric name the Grafana dashboard's queries use is one a real rollout server's /metrics
(a live server on a free port) or the learner's exporter (its registry, after a step record and
an evaluation) exports, and every metric of the exporter has a panel. The Prometheus configuration
parses and its targets are the compose services that run `gspo serve` and `gspo learn
--report-to prometheus`, at their ports, on a network Prometheus shares. The compose file
validates against the Compose Specification, and the services mount the files from the
repository where Prometheus and Grafana read them.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

import httpx
import jsonschema
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gspo_rl.learner.tracking.base import RunInfo, flatten
from gspo_rl.learner.tracking.metrics import eval_record
from gspo_rl.learner.tracking.prometheus import PrometheusBackend
from tests.deploy.test_compose import learner_config, roles_of, server_settings
from tests.helpers.compose import (
    ENV_EXAMPLE,
    REPO,
    SCHEMA_FILE,
    container_port,
    interpolate,
    load_compose,
    mounts,
    parse_dotenv,
    repo_file_for,
    services_in,
)

MONITORING = REPO / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "gspo.json"
DATASOURCES = MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = MONITORING / "grafana" / "provisioning" / "dashboards" / "gspo.yml"
PROFILES = ("gpu", "gpu1", "cpu")
_NAME = re.compile(r"\bgspo_[a-z0-9_]+")
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                              "_created"), "gauge": ("",)}


def exported(families: list[Any]) -> dict[str, set[str]]:
    """family -> the series names it exports (a labelled family without a child yet
    exports none, so they are derived from its type as well)."""
    return {f.name: {s.name for s in f.samples} | {f.name + x for x in _SUFFIXES.get(f.type, ())}
            for f in families}


@pytest.fixture(scope="module")
def server_families(served) -> dict[str, set[str]]:
    text = httpx.get(f"{served.url}/metrics", timeout=30).text  # open: no key
    return exported(list(text_string_to_metric_families(text)))


@pytest.fixture(scope="module")
def learner_families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    exporter = PrometheusBackend(RunInfo(tmp_path_factory.mktemp("prom"),
                                         {"prometheus_port": 0}))
    try:
        step = {"event": "step", "step": 1, "version": 1, "loss": 0.5, "time_wait_s": 1.0,
                "staleness": {"0": 1}, "dropped": {"dropped_stale": 1}}
        exporter.log(flatten(step), 1)
        exporter.log(flatten(eval_record("1-0", {"name": "math", "policy_version": 1,
                                                 "metrics": {"pass@1": 0.5}}, "r", 1)), 1)
        return exported(list(exporter.registry.collect()))
    finally:
        exporter.close()


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_every_dashboard_metric_is_exported_and_every_family_shown(
        server_families: dict[str, set[str]], learner_families: dict[str, set[str]]) -> None:
    used = {n for q in dashboard_queries() for n in _NAME.findall(q)}
    assert len(used) > 30
    families = server_families | learner_families
    names = {n for series in families.values() for n in series}
    assert sorted(used - names) == []
    assert not set(server_families) & set(learner_families)
    assert all(n.startswith("gspo_learner_") for n in learner_families)
    unshown = [f for f, series in learner_families.items() if not series & used]
    assert unshown == [], "a learner metric without a panel"


def test_the_dashboard_reads_the_provisioned_data_source() -> None:
    dash = json.loads(DASHBOARD.read_text())
    (source,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "gspo-rl"
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == source["uid"], panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    env = {k: v or secrets.token_urlsafe(16) for k, v in
           parse_dotenv(ENV_EXAMPLE.read_text()).items()}
    return interpolate(load_compose(), env)


def test_the_compose_profile_matches_the_specification(doc: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    for stage in (load_compose(), doc):
        assert [e.message for e in validator.iter_errors(stage)] == []
    monitoring = {n: s for n, s in doc["services"].items()
                  if "monitoring" in s.get("profiles", [])}
    assert sorted(monitoring) == ["grafana", "prometheus"]
    assert monitoring["prometheus"]["image"].startswith("prom/prometheus:")
    assert monitoring["grafana"]["image"].startswith("grafana/grafana:")
    for svc in monitoring.values():  # the host reaches them on loopback only
        assert all(str(p).startswith("127.0.0.1:") for p in svc["ports"])
    assert "backend" in monitoring["prometheus"]["networks"]
    assert set(monitoring["grafana"]["networks"]) & set(monitoring["prometheus"]["networks"])


def test_the_services_mount_the_repository_files(doc: dict[str, Any]) -> None:
    prom, grafana = doc["services"]["prometheus"], doc["services"]["grafana"]
    flag = next(a for a in prom["command"] if a.startswith("--config.file="))
    assert repo_file_for(prom, flag.split("=", 1)[1]) == MONITORING / "prometheus.yml"
    prov = "/etc/grafana/provisioning"
    assert repo_file_for(grafana, f"{prov}/datasources/prometheus.yml") == DATASOURCES
    assert repo_file_for(grafana, f"{prov}/dashboards/gspo.yml") == PROVIDERS
    (provider,) = yaml.safe_load(PROVIDERS.read_text())["providers"]
    path = provider["options"]["path"]
    assert repo_file_for(grafana, f"{path}/gspo.json") == DASHBOARD
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert repo_file_for(grafana, home) == DASHBOARD
    for svc in (prom, grafana):  # configuration read-only, data on volumes
        assert all(m.read_only for m in mounts(svc) if m.type == "bind")
        assert all(m.source in doc["volumes"] for m in mounts(svc) if m.type == "volume")


def scrape_jobs() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert len(jobs) == len(config["scrape_configs"])
    return jobs


def test_prometheus_scrapes_every_server_and_learner_of_every_profile(
        doc: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = scrape_jobs()
    prom_nets = set(doc["services"]["prometheus"]["networks"])
    found: dict[str, set[tuple[str, int]]] = {"gspo-server": set(), "gspo-learner": set()}
    for profile in PROFILES:
        roles = roles_of(services_in(doc, profile))
        (server_name, server), (learner_name, learner) = roles["serve"], roles["learn"]
        with monkeypatch.context() as mp:
            port = server_settings(server, mp).port
        cfg = learner_config(learner)
        assert "prometheus" in cfg.report_to, f"{learner_name} exports nothing"
        found["gspo-server"].add((server_name, port))
        found["gspo-learner"].add((learner_name, cfg.prometheus_port))
        for name in (server_name, learner_name):
            assert set(doc["services"][name]["networks"]) & prom_nets, name
    for job, want in found.items():
        (sd,) = jobs[job]["dns_sd_configs"]
        assert sd["type"] == "A"
        assert {(n, sd["port"]) for n in sd["names"]} == want
        assert jobs[job]["metrics_path"] == "/metrics"


def test_the_prometheus_port_is_published_nowhere_else(doc: dict[str, Any]) -> None:
    """The exporter listens inside the backend network: no learner publishes it."""
    for profile in PROFILES:
        _, learner = roles_of(services_in(doc, profile))["learn"]
        assert [container_port(p) for p in learner.get("ports", [])] == []


def test_the_monitoring_page_names_the_files() -> None:
    page = (REPO / "docs" / "deployment" / "monitoring.md").read_text()
    for path in (MONITORING / "prometheus.yml", DASHBOARD, DATASOURCES, PROVIDERS):
        assert path.relative_to(REPO).as_posix() in page
