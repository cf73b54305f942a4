"""The optional tracing component: the OpenTelemetry Collector (the compose stack's config,
the same file) and Jaeger v2 with in-memory storage, and the gateway pointed at them. The
UI is reached with ``kubectl port-forward``: no policy opens it."""

from __future__ import annotations

from inferwatch.deploy.kube import objects as o
from inferwatch.deploy.kube.network import policy, tracing_policy
from inferwatch.deploy.kube.settings import (
    COLLECTOR_HEALTH_PORT,
    JAEGER_UI_PORT,
    OTLP_GRPC_PORT,
    OTLP_HTTP_PORT,
    Model,
)
from inferwatch.deploy.kube.workloads import gateway_env_patch

COLLECTOR, JAEGER = "otel-collector", "jaeger"
COLLECTOR_IMAGE = "otel/opentelemetry-collector-contrib:0.123.0"
JAEGER_IMAGE = "jaegertracing/jaeger:2.21.0"
COLLECTOR_CONFIG = "otel-collector-config"
OTLP_ENDPOINT = f"http://{COLLECTOR}:{OTLP_HTTP_PORT}"


def _deployment(component: str, container: dict, volumes: list[dict] | None = None) -> dict:
    spec: dict = {"automountServiceAccountToken": False, "securityContext": o.pod_security(10001),
                  "containers": [container]}
    if volumes:
        spec["volumes"] = volumes
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": o.metadata(component, component),
            "spec": {"replicas": 1, "selector": {"matchLabels": o.selector(component)},
                     "template": {"metadata": {"labels": o.labels(component)}, "spec": spec}}}


def objects(collector_config: str) -> list[dict]:
    collector = o.container(
        COLLECTOR, COLLECTOR_IMAGE, ["--config=/etc/otelcol/config.yml"],
        {"otlp-http": OTLP_HTTP_PORT, "otlp-grpc": OTLP_GRPC_PORT, "health": COLLECTOR_HEALTH_PORT},
        resources={"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        probes={"liveness": o.http_probe("/", "health"), "readiness": o.http_probe("/", "health")},
        mounts=[{"name": "config", "mountPath": "/etc/otelcol", "readOnly": True}])
    jaeger = o.container(
        JAEGER, JAEGER_IMAGE, [], {"otlp-grpc": OTLP_GRPC_PORT, "ui": JAEGER_UI_PORT, "health": COLLECTOR_HEALTH_PORT},
        resources={"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}},
        probes={"liveness": o.http_probe("/status", "health"), "readiness": o.http_probe("/status", "health")})
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": o.metadata(COLLECTOR_CONFIG, COLLECTOR),
                  "data": {"config.yml": collector_config}}
    return [
        config_map,
        _deployment(COLLECTOR, collector, [{"name": "config", "configMap": {"name": COLLECTOR_CONFIG}}]),
        o.service(COLLECTOR, COLLECTOR, {"otlp-http": OTLP_HTTP_PORT, "otlp-grpc": OTLP_GRPC_PORT}),
        _deployment(JAEGER, jaeger),
        o.service(JAEGER, JAEGER, {"otlp-grpc": OTLP_GRPC_PORT, "ui": JAEGER_UI_PORT}),
        tracing_policy(),
        policy(JAEGER, JAEGER, [OTLP_GRPC_PORT], [{"podSelector": {"matchLabels": o.selector(COLLECTOR)}}]),
    ]


def gateway_patch() -> dict:
    """The gateways export their spans to the collector."""
    return gateway_env_patch([o.env("INFERWATCH_GATEWAY_OTLP_ENDPOINT", OTLP_ENDPOINT)])


def vllm_patch(model: Model) -> list[dict]:
    """A JSON patch adding the model's tracing flag: vLLM exports its spans to the collector,
    where they join the gateway's (the gateway sends W3C traceparent)."""
    args = "/spec/template/spec/containers/0/args/-"
    env = "/spec/template/spec/containers/0/env/-"
    return [{"op": "add", "path": args, "value": model.tracing_flag},
            {"op": "add", "path": args, "value": f"{OTLP_ENDPOINT}/v1/traces"},
            {"op": "add", "path": env, "value": o.env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")},
            {"op": "add", "path": env, "value": o.env("OTEL_SERVICE_NAME", model.service)}]
