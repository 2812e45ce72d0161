"""deploy/k8s: the generated parts are current, every object of the base and the overlay passes
the offline validation (kustomize, Kubernetes' strict schemas, the strict CRD schemas, the
policy checks), and a misspelled field anywhere fails it, naming the field."""

from __future__ import annotations

import copy
import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmsla import config as config_mod
from llmsla.app.k8s import crd_schemas, kubectl, render
from llmsla.app.k8s import validate as V

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"


def llmsla(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmsla", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.fixture(scope="module")
def built() -> dict[str, list[dict[str, Any]]]:
    return {d.name: V.build(d, ROOT) for d in V.kustomizations(K8S)}


def by_name(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {V.name_of(o): o for o in objects}


def test_prometheus_rule_holds_exactly_the_rule_files_groups() -> None:
    """Independent of the generator: the committed rule files, read back, in the same order."""
    rule = yaml.safe_load((K8S / "base" / "prometheus-rule.yaml").read_text())
    rules_dir = ROOT / "deploy" / "prometheus" / "rules"
    expected = []
    for f in sorted(rules_dir.glob("slo-*.yml")) + [rules_dir / "llmsla-static.yml"]:
        expected += yaml.safe_load(f.read_text())["groups"]
    assert rule["spec"]["groups"] == expected
    assert len(expected) >= 13 and any(r.get("alert") for g in expected for r in g["rules"])


def test_alertmanager_config_routes_like_alertmanager_yml() -> None:
    src = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    amc = yaml.safe_load((K8S / "base" / "alertmanager-config.yaml").read_text())["spec"]
    assert amc["route"]["receiver"] == src["route"]["receiver"]
    assert amc["route"]["groupBy"] == src["route"]["group_by"]
    for got, want in zip(amc["route"]["routes"], src["route"]["routes"], strict=True):
        assert got["receiver"] == want["receiver"]
        assert [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in got["matchers"]] == want["matchers"]
        assert got.get("continue", False) == want.get("continue", False)
    assert [r["name"] for r in amc["receivers"]] == [r["name"] for r in src["receivers"]]
    (hook,) = [w for r in amc["receivers"] for w in r.get("webhookConfigs", [])]
    assert hook["url"] == "http://llmsla-receiver.llmsla.svc:8200/v1/alerts"
    assert hook["httpConfig"]["authorization"] == {"type": "Bearer", "credentials": {"name": "llmsla-tokens", "key": "receiver-token"}}
    assert [r["equal"] for r in amc["inhibitRules"]] == [r["equal"] for r in src["inhibit_rules"]]


def test_untranslatable_alertmanager_setting_is_refused(tmp_path: Path) -> None:
    text = (ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text()
    bad = tmp_path / "am.yml"
    bad.write_text(text.replace("  group_wait: 30s\n", "  group_wait: 30s\n  mute_time_intervals: [night]\n", 1))
    with pytest.raises(ValueError, match="mute_time_intervals"):
        render.alertmanager_config(bad)


def test_base_and_overlay_pass_offline_validation(built: dict[str, list[dict[str, Any]]]) -> None:
    for name, objects in built.items():
        assert V.problems(objects) == [], name
    kinds = {o["kind"] for o in built["base"]}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "DaemonSet",
            "FlinkDeployment", "ServiceMonitor", "PodMonitor", "PrometheusRule", "AlertmanagerConfig",
            "ConfigMap", "NetworkPolicy", "Namespace", "PersistentVolumeClaim", "Role"} <= kinds
    assert {"llmsla-dashboards", "llmsla-datasources"} <= {o["metadata"]["name"] for o in built["base"] if o["kind"] == "ConfigMap"}
    def stable(objects: list[dict[str, Any]]) -> set[str]:  # the generated ConfigMap's hash differs
        return {re.sub(r"^(ConfigMap/llmsla-env)-[a-z0-9]+$", r"\1", n) for n in by_name(objects)}

    assert stable(built["base"]) == stable(built["timescaledb"])


def test_cli_validate_passes() -> None:
    done = llmsla("deploy", "validate")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deploy/k8s/overlays/timescaledb: 39 objects, 0 problems" in done.stdout


#: (object, path to a mapping, key to misspell) -- one per kind of schema
MISSPELLINGS = [
    ("FlinkDeployment/llmsla-stream", ("spec", "job"), "entryClass"),
    ("FlinkDeployment/llmsla-stream", ("spec", "taskManager", "resource"), "memory"),
    ("FlinkDeployment/llmsla-stream", ("spec", "podTemplate", "spec", "containers", 0), "envFrom"),
    ("ServiceMonitor/llmsla-gateway", ("spec", "endpoints", 0), "interval"),
    ("PodMonitor/llmsla-stream", ("spec",), "podMetricsEndpoints"),
    ("PrometheusRule/llmsla-slo", ("spec", "groups", 0, "rules", 0), "expr"),
    ("AlertmanagerConfig/llmsla", ("spec", "route", "routes", 0), "groupWait"),
    ("AlertmanagerConfig/llmsla", ("spec", "receivers", 0, "webhookConfigs", 0), "sendResolved"),
    ("Deployment/llmsla-gateway", ("spec", "template", "spec", "containers", 0), "readinessProbe"),
    ("HorizontalPodAutoscaler/llmsla-gateway", ("spec",), "minReplicas"),
    ("NetworkPolicy/llmsla-control-from-receiver", ("spec",), "policyTypes"),
]


@pytest.mark.parametrize(("name", "path", "key"), MISSPELLINGS, ids=[f"{n}:{k}" for n, _, k in MISSPELLINGS])
def test_a_misspelled_field_fails(built: dict[str, list[dict[str, Any]]], name: str, path: tuple, key: str) -> None:
    obj = copy.deepcopy(by_name(built["base"])[name])
    node: Any = obj
    for part in path:
        node = node[part]
    wrong = key.lower() if key.lower() != key else key + "s"
    node[wrong] = node.pop(key)
    problems = V.problems([obj])
    assert any(f"{wrong!r} was unexpected" in p for p in problems), problems


def test_cli_names_a_misspelling_in_the_yaml(tmp_path: Path) -> None:
    """End to end: a typo in the hand-written YAML fails `llmsla deploy validate` (exit 1)."""
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    stream = tmp_path / "deploy" / "k8s" / "base" / "stream.yaml"
    stream.write_text(stream.read_text().replace("    upgradeMode: last-state", "    upgradMode: last-state"))
    done = llmsla("deploy", "validate", "--dir", str(tmp_path / "deploy" / "k8s"), "--kube-version", "1.37.0")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FlinkDeployment/llmsla-stream: spec.job: Additional properties are not allowed ('upgradMode' was unexpected)" in done.stdout
    assert "deploy/k8s/base: 39 objects, 1 problems" in done.stdout


def test_cli_errors_name_the_option(tmp_path: Path) -> None:
    done = llmsla("deploy", "validate", "--kube-version", "1.2.0")
    assert done.returncode == 2 and "--kube-version: no schemas for 1.2.0" in done.stderr
    done = llmsla("deploy", "validate", "--dir", str(tmp_path))
    assert done.returncode == 2 and "--dir:" in done.stderr


def test_an_unknown_kind_is_an_error_not_a_pass() -> None:
    obj = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}
    (problem,) = V.problems([obj])
    assert "neither a built-in kind" in problem and "Widget" in problem


def test_policy_checks(built: dict[str, list[dict[str, Any]]]) -> None:
    objs = by_name(built["base"])
    gw = copy.deepcopy(objs["Deployment/llmsla-gateway"])
    pod = gw["spec"]["template"]["spec"]
    del pod["securityContext"]["runAsNonRoot"]
    c = pod["containers"][0]
    c["env"].append({"name": "LLMSLA_RECEIVER_TOKEN", "value": "plain"})
    del c["securityContext"]["allowPrivilegeEscalation"]
    del c["resources"]["limits"]["memory"]
    del c["livenessProbe"]
    problems = V.policy_problems(gw)
    for needle in ("runAsNonRoot must be true", "LLMSLA_RECEIVER_TOKEN: a literal secret",
                   "allowPrivilegeEscalation must be false", "resources.limits.memory is not set",
                   "livenessProbe is not set"):
        assert any(needle in p for p in problems), (needle, problems)
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
          "data": {"LLMSLA_DSN": "postgresql://u:hunter2@db/llmsla", "LLMSLA_CONTROL_TOKEN": "x"}}
    assert len(V.policy_problems(cm)) == 2
    flink = copy.deepcopy(objs["FlinkDeployment/llmsla-stream"])
    flink["spec"]["podTemplate"]["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"] = []
    assert any("capabilities.drop must contain ALL" in p for p in V.policy_problems(flink))
    cron = copy.deepcopy(objs["CronJob/llmsla-forecast-retrain"])
    retrain = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    del retrain["securityContext"]["allowPrivilegeEscalation"]
    assert any("spec.jobTemplate.spec.template.spec.containers[retrain].securityContext.allowPrivilegeEscalation"
               in p for p in V.policy_problems(cron))


def test_forecaster_follows_the_registry_and_retrains_daily(built: dict[str, list[dict[str, Any]]]) -> None:
    """The scorer is not pinned to a model directory (a pin turns the registry off, and a fresh
    claim holds no model), and the CronJob's command is one llmsla's own parser accepts."""
    from llmsla.app.cli import build_parser

    objs = by_name(built["base"])
    (serve,) = objs["Deployment/llmsla-forecaster"]["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(serve["args"])
    assert args.model is None, serve["args"]
    cron = objs["CronJob/llmsla-forecast-retrain"]["spec"]
    assert cron["concurrencyPolicy"] == "Forbid"
    (retrain,) = cron["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(retrain["args"])
    assert args.from_store and args.start is not None and not args.no_gate, retrain["args"]


def _env(objects: list[dict[str, Any]]) -> dict[str, str]:
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("llmsla-env-")]
    return cm["data"]


def test_settings_are_real_config_keys_and_agree(built: dict[str, list[dict[str, Any]]]) -> None:
    """Every LLMSLA_* value the manifests set loads through llmsla's own config loader (an
    unknown key would be an error there too), and the values that must agree do."""
    for name, objects in built.items():
        env = dict(_env(objects))
        for o in objects:
            for _, pod in V.pod_specs(o):
                for c in pod["containers"]:
                    env.update({e["name"]: e.get("value", "from-secret") for e in c.get("env", [])
                                if e["name"].startswith("LLMSLA_") and "value" in e})
        cfg = config_mod.load(env=env)
        objs = by_name(objects)
        flink = objs["FlinkDeployment/llmsla-stream"]["spec"]
        assert cfg.stream.parallelism == flink["job"]["parallelism"], name
        assert cfg.control.redis_url == "redis://llmsla-redis:6379/0"
        # the generated ConfigMap's hashed name reaches the FlinkDeployment's pod template too
        (cm_name,) = [o["metadata"]["name"] for o in objects if o["metadata"]["name"].startswith("llmsla-env-")]
        assert flink["podTemplate"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"] == cm_name
    assert config_mod.load(env=_env(built["timescaledb"])).store.timescale == "require"
    assert "LLMSLA_DSN" not in _env(built["base"])  # base: the whole DSN comes from the Secret


def test_ports_agree(built: dict[str, list[dict[str, Any]]]) -> None:
    """A container's --port argument, its containerPort, the Service's port and the defaults in
    llmsla/config.py are one number per component."""
    cfg = config_mod.Config()
    objs = by_name(built["base"])
    expect = {"llmsla-gateway": cfg.gateway.port, "llmsla-gpu": cfg.gpu.port,
              "llmsla-receiver": cfg.receiver.port, "llmsla-forecaster": cfg.forecast.port}
    for app, port in expect.items():
        kind = "DaemonSet" if app == "llmsla-gpu" else "Deployment"
        c = objs[f"{kind}/{app}"]["spec"]["template"]["spec"]["containers"][0]
        assert c["ports"][0]["containerPort"] == port, app
        if "--port" in c["args"]:
            assert c["args"][c["args"].index("--port") + 1] == str(port), app
        assert objs[f"Service/{app}"]["spec"]["ports"][0]["port"] == port, app
    gw = objs["Deployment/llmsla-gateway"]["spec"]["template"]["spec"]["containers"][0]
    assert gw["args"][gw["args"].index("--control-port") + 1] == str(cfg.control.port)
    assert objs["Service/llmsla-control"]["spec"]["ports"][0]["port"] == cfg.control.port


def test_dashboards_ship_as_sidecar_configmaps(built: dict[str, list[dict[str, Any]]]) -> None:
    """The ConfigMap the Grafana sidecar loads holds exactly `llmsla dashboards build`'s files
    (kustomize reads them at build time, so it cannot go stale), labelled for the sidecar, and
    small enough for `kubectl apply` (its last-applied annotation holds at most 256 KiB)."""
    objs = by_name(built["base"])
    cm = objs["ConfigMap/llmsla-dashboards"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = {p.name: p.read_text() for p in (ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")}
    assert cm["data"] == files
    assert sum(len(v.encode()) for v in cm["data"].values()) < 200 * 1024
    assert objs["ConfigMap/llmsla-datasources"]["metadata"]["labels"]["grafana_datasource"] == "1"


def test_stream_driver_metrics_are_scraped(built: dict[str, list[dict[str, Any]]]) -> None:
    """The job's driver (job.main() in the JobManager pod) serves llmsla_dead_letters_total and the
    window lag on stream.metrics_port: the pod declares it, listens beyond loopback, a PodMonitor
    scrapes it on the JobManager only, and the NetworkPolicy lets Prometheus in."""
    cfg = config_mod.Config()
    objs = by_name(built["base"])
    (c,) = objs["FlinkDeployment/llmsla-stream"]["spec"]["podTemplate"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["llmsla-metrics"] == cfg.stream.metrics_port == 9467
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert config_mod.load(env=env).stream.metrics_host == "0.0.0.0"
    monitor = objs["PodMonitor/llmsla-stream-driver"]["spec"]
    assert monitor["selector"]["matchLabels"] == {"app": "llmsla-stream", "component": "jobmanager"}
    assert [e["port"] for e in monitor["podMetricsEndpoints"]] == ["llmsla-metrics"]
    policy = objs["NetworkPolicy/llmsla-stream"]["spec"]
    monitoring = [r for r in policy["ingress"] if any(
        f.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name") == "monitoring"
        for f in r["from"])]
    assert cfg.stream.metrics_port in {p["port"] for r in monitoring for p in r.get("ports", [])}


def test_image_recipe_matches_the_pinned_flink() -> None:
    version = importlib.metadata.version("apache-flink")
    docker = (K8S / "image" / "Dockerfile").read_text()
    assert re.search(rf"^ARG FLINK_VERSION={re.escape(version)}$", docker, re.M)
    stream = yaml.safe_load_all((K8S / "base" / "stream.yaml").read_text())
    (flink,) = [d for d in stream if d["kind"] == "FlinkDeployment"]
    major, minor = version.split(".")[:2]
    assert flink["spec"]["flinkVersion"] == f"v{major}_{minor}"
    assert flink["spec"]["job"]["jarURI"] == f"local:///opt/flink/opt/flink-python-{version}.jar"
    python = flink["spec"]["job"]["args"][1]
    assert python == flink["spec"]["flinkConfiguration"]["python.executable"] == "/opt/llmsla/bin/python"
    assert "python3 -m venv /opt/llmsla" in docker
    assert flink["spec"]["job"]["args"][2:] == ["-pym", "llmsla.streaming.job"]


def test_schema_files_are_the_python_schemas() -> None:
    files = {p.name for p in (K8S / "schemas").glob("*.json")}
    assert files == {crd_schemas.file_name(a, k) for a, k in crd_schemas.SCHEMAS}


def test_pinned_kubectl_is_installed() -> None:
    path = kubectl.tool_path(ROOT)
    assert path.is_file(), "run `python -m llmsla.app.k8s.kubectl install` (scripts/bootstrap.sh does)"
    assert kubectl._sha256(path) == kubectl.KUBECTL_SHA256


def test_gateways_discover_the_replicas_through_the_headless_service(built: dict[str, list[dict[str, Any]]]) -> None:
    """deploy/k8s/inference holds the replicas' headless Service; the base's gateways resolve
    exactly its name and port (gateway.discovery = dns), and it passes the same validation."""
    objects = V.build(K8S / "inference", ROOT)
    assert V.problems(objects) == []
    (svc,) = [o for o in objects if o["kind"] == "Service"]
    assert svc["spec"]["clusterIP"] == "None" and not svc["spec"]["publishNotReadyAddresses"]
    cfg = config_mod.load(env=_env(built["base"]))
    assert cfg.gateway.discovery == "dns" and not cfg.gateway.upstreams
    name = f'{svc["metadata"]["name"]}.{svc["metadata"]["namespace"]}.svc.cluster.local'
    assert cfg.gateway.discovery_dns == f'{name}:{svc["spec"]["ports"][0]["port"]}'
    config_mod.check_startup(cfg)


def test_the_kubernetes_discovery_overlay_lists_the_services_pods_with_its_own_account(
        built: dict[str, list[dict[str, Any]]]) -> None:
    """overlays/kubernetes-discovery: the gateways select the pods the headless Service selects,
    in its namespace and port, as the service account the inference namespace's RoleBinding
    lets list pods (and nothing more); its token is mounted, the base's gateways mount none."""
    objs = by_name(built["kubernetes-discovery"])
    cfg = config_mod.load(env=_env(built["kubernetes-discovery"]))
    config_mod.check_startup(cfg)
    g = cfg.gateway
    assert g.discovery == "kubernetes" and not g.upstreams
    inference = V.build(K8S / "inference", ROOT)
    (svc,) = [o for o in inference if o["kind"] == "Service"]
    assert g.discovery_kubernetes == ",".join(f"{k}={v}" for k, v in svc["spec"]["selector"].items())
    assert g.discovery_kubernetes_namespace == svc["metadata"]["namespace"]
    assert g.discovery_kubernetes_port == str(svc["spec"]["ports"][0]["targetPort"])
    # the canary pool the pool label names is declared by name: arms may send units there
    assert g.discovery_kubernetes_pool_label == "llmsla.dev/pool" and g.pools == ["canary"]
    (role,) = [o for o in inference if o["kind"] == "Role"]
    (binding,) = [o for o in inference if o["kind"] == "RoleBinding"]
    assert role["metadata"]["namespace"] == svc["metadata"]["namespace"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = objs["ServiceAccount/llmsla-gateway"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    pod = objs["Deployment/llmsla-gateway"]["spec"]["template"]["spec"]
    assert account["metadata"]["namespace"] == objs["Deployment/llmsla-gateway"]["metadata"]["namespace"]
    assert pod["serviceAccountName"] == "llmsla-gateway" and pod["automountServiceAccountToken"] is True
    base_pod = by_name(built["base"])["Deployment/llmsla-gateway"]["spec"]["template"]["spec"]
    assert base_pod["automountServiceAccountToken"] is False and "serviceAccountName" not in base_pod
