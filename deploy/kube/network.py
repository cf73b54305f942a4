"""NetworkPolicies: nothing in the namespace is reachable unless a policy here says so.

Clients reach the gateways; only the gateways and Prometheus reach vLLM; the drift pair also
the rollout controllers' namespaces the settings name (``deployment.drift_client_namespaces``);
only the gateways reach Redis; only Prometheus reaches the exporter; only Alertmanager
reaches the development pager. Prometheus and Alertmanager are kube-prometheus-stack's pods
in ``Cluster.monitoring_namespace`` (their ``app.kubernetes.io/name`` labels).
"""

from __future__ import annotations

from inferwatch.deploy.kube import objects as o
from inferwatch.deploy.kube.settings import (
    DRIFT_PORT,
    EXPORTER_PORT,
    GATEWAY_PORT,
    OTLP_GRPC_PORT,
    OTLP_HTTP_PORT,
    PAGER_PORT,
    REDIS_PORT,
    VLLM_PORT,
    Settings,
)
from inferwatch.deploy.kube.workloads import DRIFT, EXPORTER, GATEWAY, PAGER, REDIS, VLLM, name

NETWORK = "network"


def _from_monitoring(settings: Settings, app: str) -> dict:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": settings.cluster.monitoring_namespace}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": app}}}


def _from(component: str) -> dict:
    return {"podSelector": {"matchLabels": o.selector(component)}}


def _rollout_controllers(settings: Settings) -> list[dict]:
    """Whoever asks the drift pair for an A/B verdict besides the gateways (Argo Rollouts'
    analysis runs, Flagger's webhooks): the namespaces ``deployment.drift_client_namespaces``
    names, by their ``kubernetes.io/metadata.name`` label."""
    return [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
            for namespace in settings.drift_client_namespaces]


def policy(obj_name: str, component: str, ports: list[int], peers: list[dict] | None) -> dict:
    """Ingress to ``component``'s pods on ``ports`` from ``peers`` (None: from anywhere)."""
    rule: dict = {"ports": [{"protocol": "TCP", "port": port} for port in ports]}
    if peers is not None:
        rule["from"] = peers
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": o.metadata(obj_name, NETWORK),
            "spec": {"podSelector": {"matchLabels": o.selector(component)}, "policyTypes": ["Ingress"],
                     "ingress": [rule]}}


def policies(settings: Settings) -> list[dict]:
    prometheus = _from_monitoring(settings, "prometheus")
    deny = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": o.metadata("inferwatch-default-deny", NETWORK),
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    return [
        deny,
        policy(name(GATEWAY), GATEWAY, [GATEWAY_PORT], None),
        policy(name(VLLM), VLLM, [VLLM_PORT], [_from(GATEWAY), prometheus]),
        policy(name(DRIFT), DRIFT, [DRIFT_PORT], [_from(GATEWAY), prometheus, *_rollout_controllers(settings)]),
        policy(name(REDIS), REDIS, [REDIS_PORT], [_from(GATEWAY)]),
        policy(name(EXPORTER), EXPORTER, [EXPORTER_PORT], [prometheus]),
        policy(name(PAGER), PAGER, [PAGER_PORT], [_from_monitoring(settings, "alertmanager")]),
    ]


def tracing_policy() -> dict:
    """The collector takes spans from the gateways and vLLM only."""
    return policy("otel-collector", "otel-collector", [OTLP_HTTP_PORT, OTLP_GRPC_PORT], [_from(GATEWAY), _from(VLLM)])
