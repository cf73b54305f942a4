"""deploy/kubernetes: what a cluster would check on admission, checked without a cluster.

Every overlay (and every component added to one) builds with ``kubectl kustomize``; every
object validates against the Kubernetes OpenAPI schemas of ``KUBERNETES_VERSION`` in strict
mode (kubernetes-validate), and every custom resource against its CRD's schema, vendored
under tests/deploy/crds/ with unknown fields rejected; then the objects are checked
against each other (Services select pods and name their ports, monitors select Services,
secrets are the documented ones), the rules against alerts/rules and promtool, the
settings against the components' own. That the tree is current is
tests/inferwatch/test_generate.py's golden test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from functools import cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from inferwatch.alerts import dcgm, spec
from inferwatch.alerts.generate import RULES_DIR
from inferwatch.dashboards.generate import JSON_DIR
from inferwatch.deploy.kube import autoscaling, settings as kube
from inferwatch.deploy.kube.monitoring import LEFT_OUT
from inferwatch.deploy.kube.settings import DEFAULT as KUBE
from inferwatch.deploy.kube.workloads import VLLM_API_KEY
from inferwatch.deploy.manifests import K8S_DIR
from tests.deploy.crd_schema import CRD_DIR, KubeLoader, custom_resource_validator

OVERLAYS = KUBE.overlays

KUBERNETES_VERSION = "1.32.0"  # kubectl's here; kube-prometheus-stack and KEDA support it
ROOT = Path(__file__).resolve().parents[2]
LAST_APPLIED_LIMIT = 262_144  # kubectl apply keeps the object in an annotation of at most 256 KiB
COMPONENTS = sorted(p.name for p in (K8S_DIR / "components").iterdir())


def kustomize(directory: Path) -> list[dict]:
    result = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.load_all(result.stdout, Loader=KubeLoader) if d]


@cache
def built(overlay: str) -> tuple[dict, ...]:
    return tuple(kustomize(K8S_DIR / "overlays" / overlay))


def with_everything(overlay: str, tmp_path: Path) -> list[dict]:
    """The overlay with every component and the model's tracing: what a full install runs."""
    model = OVERLAYS[overlay]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(K8S_DIR / "overlays" / overlay, tmp_path)],
        "components": [os.path.relpath(K8S_DIR / "components" / c, tmp_path) for c in COMPONENTS]
        + [os.path.relpath(K8S_DIR / "models" / model.folder / "tracing", tmp_path)]}))
    return kustomize(tmp_path)


def _key(obj: dict) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _by_kind(objects, kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def _pod_templates(objects) -> list[tuple[dict, dict]]:
    """(workload, pod template) of every workload."""
    return [(o, o["spec"]["template"]) for o in objects
            if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]


# -- builds and schemas ------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_overlay_builds_and_every_object_is_valid(overlay, tmp_path):
    objects = with_everything(overlay, tmp_path)
    assert {_key(o) for o in built(overlay)} < {_key(o) for o in objects}
    custom = 0
    for obj in objects:
        assert obj["metadata"].get("namespace", kube.NAMESPACE) == kube.NAMESPACE or obj["kind"] == "Namespace"
        if "." in obj["apiVersion"].split("/")[0] and not obj["apiVersion"].startswith(
                ("apps/", "policy/", "autoscaling/", "networking.k8s.io/")):
            errors = sorted(custom_resource_validator(obj["apiVersion"], obj["kind"]).iter_errors(obj),
                            key=lambda e: list(e.path))
            assert not errors, f"{_key(obj)}: {errors[0].message} at {list(errors[0].path)}"
            custom += 1
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        assert len(json.dumps(obj)) < LAST_APPLIED_LIMIT, _key(obj)
    assert custom >= 7  # 4 monitors, 1-2 PrometheusRules, the AlertmanagerConfig, the ScaledObject


DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1035: Service names
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_names_and_labels_are_what_the_api_server_accepts(overlay, tmp_path):
    """The OpenAPI schemas say "string"; the API server also checks these formats."""
    for obj in with_everything(overlay, tmp_path):
        name = obj["metadata"]["name"]
        assert (DNS_LABEL if obj["kind"] in ("Service", "Namespace") else DNS_SUBDOMAIN).match(name), _key(obj)
        for template in (obj, obj.get("spec", {}).get("template", {})):
            for value in template.get("metadata", {}).get("labels", {}).values():
                assert LABEL_VALUE.match(value), (_key(obj), value)


def test_the_schemas_reject_what_a_cluster_would():
    """The validators are not lenient: an unknown field, a wrong type, a missing field fail."""
    deployment = next(o for o in built("gpu") if o["kind"] == "Deployment")
    bad = json.loads(json.dumps(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicey"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)
    monitor = next(o for o in built("gpu") if o["kind"] == "ServiceMonitor")
    validator = custom_resource_validator(monitor["apiVersion"], "ServiceMonitor")
    for broken in ({"jobLable": "x"}, {"endpoints": [{"port": 8080}]}, {"endpoints": [{"interval": "ten"}]}):
        assert list(validator.iter_errors({**monitor, "spec": {**monitor["spec"], **broken}})), broken
    scaled = next(o for o in built("gpu") if o["kind"] == "ScaledObject")
    validator = custom_resource_validator(scaled["apiVersion"], "ScaledObject")
    assert list(validator.iter_errors({**scaled, "spec": {**scaled["spec"], "scaleTargetRef": {}}}))


def test_vendored_crds_say_where_they_come_from():
    notes = (CRD_DIR / "README.md").read_text()
    for crd in CRD_DIR.glob("*.yaml"):
        assert crd.name in notes, f"{crd.name}: no upstream version and source in {CRD_DIR / 'README.md'}"


# -- objects against each other ------------------------------------------------------------------

@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_services_and_monitors_select_what_exists(overlay, tmp_path):
    objects = with_everything(overlay, tmp_path)
    pods = _pod_templates(objects)

    def ports_of(template: dict) -> set[str]:
        return {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}

    def selects(selector: dict, labels: dict) -> bool:
        return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

    for svc in _by_kind(objects, "Service"):
        matched = [t for _, t in pods if selects(svc["spec"]["selector"], t["metadata"]["labels"])]
        assert matched, f"Service {svc['metadata']['name']} selects no pod"
        for port in svc["spec"]["ports"]:
            assert all(port["targetPort"] in ports_of(t) for t in matched), (svc["metadata"]["name"], port)
    for mon in _by_kind(objects, "ServiceMonitor"):
        services = [s for s in _by_kind(objects, "Service")
                    if selects(mon["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        assert services, f"ServiceMonitor {mon['metadata']['name']} selects no Service"
        for svc in services:
            assert {e["port"] for e in mon["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
            assert svc["metadata"]["labels"][mon["spec"]["jobLabel"]] in spec_jobs()
    for mon in _by_kind(objects, "PodMonitor"):
        matched = [t for _, t in pods if selects(mon["spec"]["selector"]["matchLabels"], t["metadata"]["labels"])]
        assert matched and all(e["port"] in ports_of(t) for t in matched for e in mon["spec"]["podMetricsEndpoints"])
        assert all(t["metadata"]["labels"][mon["spec"]["jobLabel"]] in spec_jobs() for t in matched)
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        for obj in _by_kind(objects, kind):
            selector = obj["spec"]["podSelector" if kind == "NetworkPolicy" else "selector"].get("matchLabels", {})
            assert not selector or any(selects(selector, t["metadata"]["labels"]) for _, t in pods), _key(obj)
    names = {_key(o) for o in objects}
    for obj in _by_kind(objects, "ScaledObject") + _by_kind(objects, "HorizontalPodAutoscaler"):
        ref = obj["spec"]["scaleTargetRef"]
        assert (ref["kind"], ref["name"]) in names, _key(obj)
    for _, template in pods:
        account = template["spec"].get("serviceAccountName")
        assert account is None or ("ServiceAccount", account) in names


def spec_jobs() -> set[str]:
    return {spec.JOB_GATEWAY, spec.JOB_VLLM, spec.JOB_EXPORTER, spec.JOB_DRIFT}


def test_vllm_and_the_exporter_are_labelled_with_their_node_as_host():
    """The cost rules give a vLLM the GPUs of its host (alerts/cost.py): a pod's address says
    nothing of its node, so both monitors write the node into ``host``."""
    objects = built("gpu")
    [vllm] = [m for m in _by_kind(objects, "ServiceMonitor") if m["metadata"]["name"] == spec.JOB_VLLM]
    [exporter] = _by_kind(objects, "PodMonitor")
    node = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "host", "action": "replace"}
    assert all(node in e["relabelings"] for e in vllm["spec"]["endpoints"])
    assert all(node in e["relabelings"] for e in exporter["spec"]["podMetricsEndpoints"])


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_secret_is_a_documented_users_secret_mounted_as_a_file(overlay, tmp_path):
    objects = with_everything(overlay, tmp_path)
    documented = {s.name: s for s in kube.USER_SECRETS}
    guide = (ROOT / "docs" / "kubernetes.md").read_text()
    assert not _by_kind(objects, "Secret"), "a Secret in the manifests: secrets are the user's"
    config_maps = {o["metadata"]["name"] for o in _by_kind(objects, "ConfigMap")}
    for workload, template in _pod_templates(objects):
        containers = template["spec"]["containers"] + template["spec"].get("initContainers", [])
        for c in containers:
            for var in c.get("env", []):
                if var["name"] == VLLM_API_KEY:  # vLLM reads its key from no file: by reference
                    assert var["valueFrom"] == {"secretKeyRef": {"name": kube.UPSTREAM_SECRET.name, "key": "api_key"}}
                    continue
                assert "valueFrom" not in var, (workload["metadata"]["name"], var)  # files, never env values
                assert not any(word in var["name"] for word in ("TOKEN", "KEY", "PASSWORD")) \
                    or var["name"].endswith(("_FILE", "_PATH")), var
            assert "envFrom" not in c
        for volume in template["spec"].get("volumes", []):
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                assert name in documented and f"`{name}`" in guide, name
                assert volume["secret"].get("optional", False) == documented[name].optional or \
                    name == kube.UPSTREAM_SECRET.name  # required once its component is chosen
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps
    for keys in (kube.GATEWAY_SECRET.keys, kube.DRIFT_SECRET.keys):
        assert all(f"{k}" in guide for k in keys)


def test_pods_run_unprivileged_with_limits_and_probes():
    for overlay in OVERLAYS:
        for workload, template in _pod_templates(built(overlay)):
            pod = template["spec"]
            name = workload["metadata"]["name"]
            assert pod.get("automountServiceAccountToken") is False, name
            for c in pod["containers"]:
                assert c["resources"]["requests"] and "memory" in c["resources"]["limits"], (name, c["name"])
                assert "livenessProbe" in c and "readinessProbe" in c, (name, c["name"])
                assert c["securityContext"]["allowPrivilegeEscalation"] is False
                assert "nvidia.com/gpu" not in c["resources"]["requests"] or workload["kind"] == "Deployment"
            if c["image"].startswith("vllm/"):
                continue  # vLLM's own image runs as root (docs/kubernetes.md)
            assert pod["securityContext"]["runAsNonRoot"] is True, name
            for c in pod["containers"]:
                assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], name
                assert c["securityContext"]["readOnlyRootFilesystem"] or name.startswith("vllm-"), name


def test_the_exporter_takes_no_gpu_and_runs_on_gpu_nodes_only():
    [exporter] = [o for o in built("gpu") if o["kind"] == "DaemonSet"]
    pod = exporter["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert "nvidia.com/gpu" not in json.dumps(c["resources"])
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in c["env"]
    assert pod["nodeSelector"] == dict([kube.Cluster().gpu_node_label])
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert "--processes" not in c["args"]  # the one thing hostPID would buy: processes named by host PID


def test_every_pod_meets_the_baseline_pod_security_the_namespace_enforces():
    """Pod Security Standards' baseline: no host namespaces, ports or paths, nothing
    privileged, no added capability, no unconfined seccomp."""
    for overlay in OVERLAYS:
        objects = built(overlay)
        [namespace] = _by_kind(objects, "Namespace")
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
        for workload, template in _pod_templates(objects):
            pod, name = template["spec"], workload["metadata"]["name"]
            assert not any(pod.get(k) for k in ("hostPID", "hostIPC", "hostNetwork")), name
            assert not any("hostPath" in v for v in pod.get("volumes", [])), name
            for c in pod["containers"] + pod.get("initContainers", []):
                context = c.get("securityContext", {})
                assert not context.get("privileged") and not context.get("capabilities", {}).get("add"), name
                assert all("hostPort" not in p for p in c.get("ports", [])), name
            assert pod.get("securityContext", {}).get("seccompProfile", {}).get("type") == "RuntimeDefault", name


def test_the_chart_prometheus_is_found_from_the_release_name():
    """kube-prometheus-stack's Service is ``<fullname>-prometheus``; its fullname is the
    release when that contains the chart's name, else ``<release>-kube-prometheus-stack``
    cut to 26 characters (``helm install prometheus ...`` gives the well-known name below)."""
    assert kube.Cluster().prometheus_url == "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
    assert kube.Cluster(release="prometheus").prometheus_url == \
        "http://prometheus-kube-prometheus-prometheus.monitoring.svc:9090"
    assert kube.Cluster(release="kps", monitoring_namespace="obs").prometheus_url == \
        "http://kps-kube-prometheus-stack-prometheus.obs.svc:9090"
    drift_args = next(o for o in built("gpu") if _key(o) == ("StatefulSet", "inferwatch-drift"))[
        "spec"]["template"]["spec"]["containers"][0]["args"]
    assert drift_args[drift_args.index("--prometheus-url") + 1] == kube.Cluster().prometheus_url


def test_scaling_holds_what_it_has_when_it_cannot_read_the_queue():
    for overlay, _model in OVERLAYS.items():
        [scaled] = _by_kind(built(overlay), "ScaledObject")
        assert scaled["spec"]["fallback"]["behavior"] == "currentReplicas"  # never shed a busy GPU pod
        [trigger] = scaled["spec"]["triggers"]
        assert trigger["metadata"]["ignoreNullValues"] == "false"  # an empty query is a failure, not 0
        assert trigger["metadata"]["serverAddress"] == kube.Cluster().prometheus_url


def test_pods_drain_before_they_stop():
    """A pod's grace covers the longest upstream request after the preStop pause, which
    outlasts the time callers keep sending to it (the gateways' re-resolve of vLLM)."""
    from inferwatch.serving.settings import GatewaySettings
    defaults = GatewaySettings()
    for overlay, model in OVERLAYS.items():
        objects = built(overlay)
        for name in ("inferwatch-gateway", model.service):
            [deployment] = [o for o in objects if _key(o) == ("Deployment", name)]
            assert "replicas" not in deployment["spec"], name  # the HPA's or KEDA's, not the file's
            pod = deployment["spec"]["template"]["spec"]
            pause = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
            assert pod["terminationGracePeriodSeconds"] >= pause + defaults.upstream_timeout_s, name
        vllm_pod = next(o for o in objects if _key(o) == ("Deployment", model.service))["spec"]["template"]["spec"]
        assert vllm_pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"] > defaults.upstream_resolve_s


def test_redis_is_capped_below_its_memory_limit_and_evicts_only_what_expires():
    [redis] = [o for o in built("gpu") if _key(o) == ("StatefulSet", "inferwatch-redis")]
    [c] = redis["spec"]["template"]["spec"]["containers"]
    cap = c["args"][c["args"].index("--maxmemory") + 1]
    assert _bytes(cap) < _bytes(c["resources"]["limits"]["memory"]) * 0.85  # room for the AOF rewrite's fork
    assert c["args"][c["args"].index("--maxmemory-policy") + 1] == "volatile-ttl"
    [service] = [o for o in built("gpu") if _key(o) == ("Service", redis["spec"]["serviceName"])]
    assert service["spec"]["clusterIP"] == "None"


def _bytes(quantity: str) -> float:
    units = {"mb": 1e6, "gb": 1e9, "Mi": 2 ** 20, "Gi": 2 ** 30}
    [(number, unit)] = re.findall(r"^(\d+)([A-Za-z]+)$", quantity)
    return int(number) * units[unit]


def test_the_gateways_resolve_their_models_headless_service_and_the_drift_pair():
    for overlay, model in OVERLAYS.items():
        objects = built(overlay)
        [gateway] = [o for o in objects if _key(o) == ("Deployment", "inferwatch-gateway")]
        env = {v["name"]: v["value"] for v in gateway["spec"]["template"]["spec"]["containers"][0]["env"]}
        [service] = [o for o in objects if _key(o) == ("Service", model.service)]
        assert service["spec"]["clusterIP"] == "None"
        assert env["INFERWATCH_GATEWAY_UPSTREAM_URL"] == f"http://{model.service}:{service['spec']['ports'][0]['port']}"
        [drift] = [o for o in objects if _key(o) == ("StatefulSet", "inferwatch-drift")]
        assert drift["spec"]["replicas"] == 2 and drift["spec"]["serviceName"] == "inferwatch-drift"
        assert env["INFERWATCH_GATEWAY_DRIFT_URLS"].split(",") == [
            f"http://inferwatch-drift-{i}.inferwatch-drift:{kube.DRIFT_PORT}" for i in range(2)]
        [hpa] = [o for o in objects if _key(o) == ("HorizontalPodAutoscaler", "inferwatch-gateway")]
        assert hpa["spec"]["minReplicas"] >= 2


def test_ports_and_settings_are_the_components_own():
    """The manifests' ports are each component's default, and every INFERWATCH_* variable
    they set is a setting of the component that reads it."""
    from inferwatch.drift.service.app import DriftSettings
    from inferwatch.exporters.server import ExporterSettings
    from inferwatch.serving.settings import GatewaySettings

    assert (
        GatewaySettings.model_fields["port"].default, DriftSettings.model_fields["port"].default,
        ExporterSettings.model_fields["port"].default) == (kube.GATEWAY_PORT, kube.DRIFT_PORT, kube.EXPORTER_PORT)
    settings_of = {"INFERWATCH_GATEWAY_": GatewaySettings, "INFERWATCH_DRIFT_": DriftSettings,
                   "INFERWATCH_EXPORTER_": ExporterSettings}
    for overlay in OVERLAYS:
        for _, template in _pod_templates(built(overlay)):
            for c in template["spec"]["containers"] + template["spec"].get("initContainers", []):
                for var in c.get("env", []):
                    for prefix, cls in settings_of.items():
                        if var["name"].startswith(prefix):
                            field = var["name"].removeprefix(prefix).lower()
                            assert field in cls.model_fields or field.removesuffix("_file") in cls.model_fields, var
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    from inferwatch.deploy.kube import tracing, workloads
    for service, image in (("otel-collector", tracing.COLLECTOR_IMAGE), ("jaeger", tracing.JAEGER_IMAGE),
                           ("redis", workloads.REDIS_IMAGE), ("vllm-gpu", OVERLAYS["gpu"].image)):
        assert compose[service]["image"].split(":-")[-1].rstrip("}") == image, service


# -- rules, paging, autoscaling -----------------------------------------------------------------

def _rule_groups(obj: dict) -> list[dict]:
    """The groups with the namespace label the manifests add taken off again."""
    groups = json.loads(json.dumps(obj["spec"]["groups"]))
    for group in groups:
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["labels"].pop("namespace") == kube.NAMESPACE, rule["alert"]
                if not rule["labels"]:
                    del rule["labels"]
    return groups


def test_prometheus_rules_are_the_rule_files_and_pass_promtool(tmp_path):
    objects = {o["metadata"]["name"]: o for o in _by_kind(with_everything("gpu", tmp_path), "PrometheusRule")}
    for name, sources in (("inferwatch", sorted(RULES_DIR.glob("*.yml"))),
                          ("inferwatch-dcgm-exporter-compat", [dcgm.OUT])):
        rule = objects[name]
        assert rule["metadata"]["labels"]["release"] == kube.Cluster().release
        assert _rule_groups(rule) == [{**g, "rules": [r for r in g["rules"] if r.get("alert") not in LEFT_OUT]}
                                      for f in sources for g in yaml.safe_load(f.read_text())["groups"]]
        alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
        assert not any(a.startswith(("Prometheus", "Alertmanager", "Host")) for a in alerts)  # the chart's own
        extracted = tmp_path / f"{name}.rules.yml"
        extracted.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        result = subprocess.run(["promtool", "check", "rules", str(extracted)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_alertmanager_config_routes_as_the_compose_config(tmp_path):
    """Tier by tier the same tree as deploy/alertmanager/alertmanager.yml, plus the
    namespace matcher the Operator adds, which every alert of the rules carries."""
    from inferwatch.deploy.kube.monitoring import CAMEL

    [config] = _by_kind(built("gpu"), "AlertmanagerConfig")
    compose = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    ours = config["spec"]["route"]
    assert [(r["receiver"], [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in r["matchers"]])
            for r in ours["routes"]] == [(r["receiver"], r["matchers"]) for r in compose["route"]["routes"]]
    for key, camel in CAMEL.items():
        assert ours[camel] == compose["route"][key]
        for a, b in zip(ours["routes"], compose["route"]["routes"]):
            assert a.get(camel) == b.get(key)
    assert {r["name"] for r in config["spec"]["receivers"]} == {r["name"] for r in compose["receivers"]}
    assert config["metadata"]["labels"]["release"] == kube.Cluster().release
    [with_pd] = _by_kind(with_everything("gpu", tmp_path), "AlertmanagerConfig")
    [pager] = [r for r in with_pd["spec"]["receivers"] if r["name"] == "pager"]
    assert pager["pagerdutyConfigs"][0]["routingKey"]["name"] == kube.PAGERDUTY_SECRET.name


def test_dashboards_are_config_maps_grafanas_sidecar_loads():
    maps = [o for o in built("gpu") if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    assert len(maps) == len(list(JSON_DIR.glob("*.json")))
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        [(file_name, text)] = cm["data"].items()
        assert json.loads(text) == json.loads((JSON_DIR / file_name).read_text())


def test_autoscaling_queries_parse_and_read_the_gauge_vllm_exports(tmp_path):
    from inferwatch.alerts.catalog import metric

    for overlay, model in OVERLAYS.items():
        [scaled] = _by_kind(built(overlay), "ScaledObject")
        [trigger] = scaled["spec"]["triggers"]
        assert trigger["metadata"]["query"] == autoscaling.waiting_query(model, KUBE.namespace)
        assert metric(autoscaling.WAITING) == autoscaling.WAITING
        assert scaled["spec"]["fallback"]["replicas"] >= 1 and scaled["spec"]["minReplicaCount"] >= 1
        rules = tmp_path / f"{overlay}.yml"
        rules.write_text(yaml.safe_dump({"groups": [{"name": "keda", "rules": [
            {"record": "keda:query", "expr": trigger["metadata"]["query"]}]}]}))
        result = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def _probe_window_s(probe: dict) -> int:
    """How long a probe must fail in a row before Kubernetes acts: failures x period."""
    return probe["failureThreshold"] * probe["periodSeconds"]


def test_a_busy_vllm_is_taken_out_by_readiness_long_before_liveness_restarts_it():
    """A vLLM that answers /health late under load leaves the Service within ~10 s and is
    restarted only after minutes without an answer: a restart loses every request it holds."""
    for overlay, model in OVERLAYS.items():
        [deployment] = [o for o in built(overlay) if o["kind"] == "Deployment" and o["metadata"]["name"] == model.service]
        [c] = deployment["spec"]["template"]["spec"]["containers"]
        ready, live = c["readinessProbe"], c["livenessProbe"]
        assert _probe_window_s(ready) <= 15 and ready["timeoutSeconds"] <= 5
        assert _probe_window_s(live) >= 120 and live["timeoutSeconds"] >= 10
        assert _probe_window_s(live) >= 10 * _probe_window_s(ready)


def test_rollout_controllers_named_in_the_settings_reach_the_drift_pair_and_no_one_else():
    from inferwatch.config.settings import Deployment, Settings
    from inferwatch.deploy.kube import network
    from inferwatch.deploy.kube.settings import from_config

    def drift_peers(settings) -> list[dict]:
        [drift] = [p for p in network.policies(settings) if p["metadata"]["name"] == "inferwatch-drift"]
        return drift["spec"]["ingress"][0]["from"]

    default = drift_peers(from_config())
    assert not [p for p in default if "podSelector" not in p]  # the gateways and Prometheus only
    opened = drift_peers(from_config(Settings(deployment=Deployment(drift_client_namespaces=["argo-rollouts",
                                                                                            "flagger-system"]))))
    added = [p for p in opened if p not in default]
    assert added == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}
                     for ns in ("argo-rollouts", "flagger-system")]
    others = [p for p in network.policies(from_config(Settings(deployment=Deployment(
        drift_client_namespaces=["argo-rollouts"])))) if p["metadata"]["name"] != "inferwatch-drift"]
    assert others == [p for p in network.policies(from_config()) if p["metadata"]["name"] != "inferwatch-drift"]


def test_the_pod_resources_component_mounts_the_kubelet_socket_read_only_for_the_exporter_alone(tmp_path):
    from inferwatch.exporters.pod_resources import DEFAULT_SOCKET
    from inferwatch.exporters.server import ExporterSettings
    objects = with_everything("gpu", tmp_path)
    [exporter] = _by_kind(objects, "DaemonSet")
    pod = exporter["spec"]["template"]["spec"]
    [c] = pod["containers"]
    [mount] = [m for m in c["volumeMounts"] if m["name"] == "pod-resources"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "pod-resources"]
    # the exporter's default socket is inside the folder mounted, read-only, from the host's same folder
    assert ExporterSettings().pod_resources_socket == DEFAULT_SOCKET
    assert mount == {"name": "pod-resources", "mountPath": str(DEFAULT_SOCKET.parent), "readOnly": True}
    assert volume["hostPath"] == {"path": str(DEFAULT_SOCKET.parent), "type": "Directory"}
    assert c["securityContext"]["runAsUser"] == 0 and c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["securityContext"]["readOnlyRootFilesystem"] and not c["securityContext"].get("privileged")
    [namespace] = _by_kind(objects, "Namespace")
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == "baseline"
    # no other pod takes a host path or runs as root for it
    for workload, template in _pod_templates(objects):
        if workload is not exporter:
            assert not any("hostPath" in v for v in template["spec"].get("volumes", [])), workload["metadata"]["name"]
