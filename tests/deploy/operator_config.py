"""The scrape jobs the Prometheus Operator writes for a ServiceMonitor or PodMonitor, so the
manifests' job names and relabelings can be run by a real Prometheus without a cluster.

The relabel rules follow prometheus-operator v0.93.0's config generator
(pkg/prometheus/promcfg.go: generateServiceMonitorConfig, generatePodMonitorConfig) for
the fields the manifests use: the selector as keep rules on the discovered labels, the
port, the namespace/service/pod/container labels, the job (the object's default, then
``jobLabel``), ``endpoint``, then the monitor's own relabelings and metric relabelings.
Kubernetes discovery is replaced by static targets carrying the ``__meta_kubernetes_*``
labels it would give them (``discovered``), which relabeling sees the same way.
"""

from __future__ import annotations

import re


def sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _relabel(rule: dict) -> dict:
    """A CRD relabeling (camelCase) in Prometheus' spelling."""
    spelled = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {spelled.get(key, key): value for key, value in rule.items()}


def _common(kind_prefix: str, selector: dict[str, str], port_label: str, port: str) -> list[dict]:
    rules = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for key in sorted(selector):
        rules.append({"action": "keep", "source_labels": [f"{kind_prefix}_label_{sanitize(key)}",
                                                          f"{kind_prefix}_labelpresent_{sanitize(key)}"],
                      "regex": f"({selector[key]});true"})
    rules.append({"action": "keep", "source_labels": [port_label], "regex": port})
    return rules


def service_monitor_job(monitor: dict, namespace: str, targets: list[dict]) -> dict:
    """The job of the monitor's first endpoint, with ``targets`` (``discovered``) for discovery."""
    spec, [endpoint] = monitor["spec"], monitor["spec"]["endpoints"]
    kinds = ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"]
    rules = _common("__meta_kubernetes_service", spec["selector"]["matchLabels"],
                    "__meta_kubernetes_endpoint_port_name", endpoint["port"]) + [
        {"source_labels": kinds, "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
        {"source_labels": kinds, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
    ]
    if spec.get("jobLabel"):
        rules.append({"source_labels": [f"__meta_kubernetes_service_label_{sanitize(spec['jobLabel'])}"],
                      "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
    rules.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    return _job(f"serviceMonitor/{namespace}/{monitor['metadata']['name']}/0", endpoint, rules, targets)


def pod_monitor_job(monitor: dict, namespace: str, targets: list[dict]) -> dict:
    spec, [endpoint] = monitor["spec"], monitor["spec"]["podMetricsEndpoints"]
    rules = _common("__meta_kubernetes_pod", spec["selector"]["matchLabels"],
                    "__meta_kubernetes_pod_container_port_name", endpoint["port"]) + [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"target_label": "job", "replacement": f"{namespace}/{monitor['metadata']['name']}"},
    ]
    if spec.get("jobLabel"):
        rules.append({"source_labels": [f"__meta_kubernetes_pod_label_{sanitize(spec['jobLabel'])}"],
                      "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
    rules.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    return _job(f"podMonitor/{namespace}/{monitor['metadata']['name']}/0", endpoint, rules, targets)


def _job(name: str, endpoint: dict, rules: list[dict], targets: list[dict]) -> dict:
    job = {"job_name": name, "honor_labels": endpoint.get("honorLabels", False), "static_configs": targets,
           "scrape_interval": endpoint.get("interval", "10s"), "metrics_path": endpoint.get("path", "/metrics"),
           "scheme": endpoint.get("scheme", "http"),
           "relabel_configs": rules + [_relabel(r) for r in endpoint.get("relabelings", [])]}
    if endpoint.get("metricRelabelings"):
        job["metric_relabel_configs"] = [_relabel(r) for r in endpoint["metricRelabelings"]]
    return job


def discovered(address: str, namespace: str, pod: dict, container: str, port_name: str,
               service: dict | None = None) -> dict:
    """A static target labelled as Kubernetes discovery labels the pod behind ``service``
    (endpoints role) or the pod itself (pod role): ``pod`` is the workload's pod template."""
    name = f"{pod['metadata']['labels'].get('app.kubernetes.io/component', 'pod')}-0"
    labels = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": name,
              "__meta_kubernetes_pod_phase": "Running", "__meta_kubernetes_pod_container_name": container,
              "__meta_kubernetes_pod_container_port_name": port_name}
    for key, value in pod["metadata"]["labels"].items():
        labels[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = value
        labels[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
    if service is not None:
        labels |= {"__meta_kubernetes_service_name": service["metadata"]["name"],
                   "__meta_kubernetes_endpoint_port_name": port_name,
                   "__meta_kubernetes_endpoint_address_target_kind": "Pod",
                   "__meta_kubernetes_endpoint_address_target_name": name}
        for key, value in service["metadata"]["labels"].items():
            labels[f"__meta_kubernetes_service_label_{sanitize(key)}"] = value
            labels[f"__meta_kubernetes_service_labelpresent_{sanitize(key)}"] = "true"
    return {"targets": [address], "labels": labels}
