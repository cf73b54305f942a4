"""vLLM scaled on its queue: requests waiting per replica, the signal the production
inference checklists scale on (vllm-project/production-stack's ScaledObject reads the same
gauge). KEDA's ScaledObject by default; an HPA on the same query through the Prometheus
Adapter for clusters without KEDA (docs/kubernetes.md has the adapter's rule)."""

from __future__ import annotations

from inferwatch.deploy.kube import objects as o
from inferwatch.deploy.kube.settings import Model, Settings
from inferwatch.deploy.kube.workloads import VLLM

WAITING = "vllm:num_requests_waiting"
ADAPTER_METRIC = "vllm_num_requests_waiting"  # the name the Prometheus Adapter's rule exposes it as


def waiting_query(model: Model, namespace: str) -> str:
    """Requests waiting across the model's replicas; KEDA divides by the replicas."""
    return f'sum({WAITING}{{namespace="{namespace}", model="{model.name}"}})'


def _behavior(settings: Settings) -> dict:
    """Up at once (a queue is users waiting), down only after the cooldown."""
    return {"scaleUp": {"stabilizationWindowSeconds": 0,
                        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
            "scaleDown": {"stabilizationWindowSeconds": settings.autoscaling.cooldown_s,
                          "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]}}


def scaled_object(model: Model, settings: Settings) -> dict:
    scaling = settings.autoscaling
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": o.metadata(model.service, VLLM, **{"inferwatch.dev/model": model.name}),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": model.service},
                     "minReplicaCount": model.min_replicas, "maxReplicaCount": model.max_replicas,
                     "pollingInterval": scaling.polling_s, "cooldownPeriod": scaling.cooldown_s,
                     # Prometheus unreachable, or the query empty (scrape or relabel broken), three
                     # polls in a row: hold the replicas there are (a busy model keeps them)
                     "fallback": {"failureThreshold": 3, "replicas": model.min_replicas,
                                  "behavior": "currentReplicas"},
                     "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(settings)}},
                     "triggers": [{"type": "prometheus", "metricType": "AverageValue", "metadata": {
                         "serverAddress": settings.cluster.prometheus_url, "query": waiting_query(model, settings.namespace),
                         "threshold": str(model.waiting_per_replica), "ignoreNullValues": "false"}}]}}


def adapter_hpa(model: Model, settings: Settings) -> dict:
    """The same target through the Prometheus Adapter's external metrics API."""
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": o.metadata(model.service, VLLM, **{"inferwatch.dev/model": model.name}),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": model.service},
                     "minReplicas": model.min_replicas, "maxReplicas": model.max_replicas,
                     "behavior": _behavior(settings),
                     "metrics": [{"type": "External", "external": {
                         "metric": {"name": ADAPTER_METRIC, "selector": {"matchLabels": {"model": model.name}}},
                         "target": {"type": "AverageValue", "averageValue": str(model.waiting_per_replica)}}}]}}


def adapter_rule() -> dict:
    """The Prometheus Adapter rule (its Helm values' ``rules.external``) that serves the
    HPA's metric: the gauge summed by model in the HPA's namespace."""
    return {"seriesQuery": f'{WAITING}{{namespace!="",model!=""}}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
            "name": {"matches": "^vllm:num_requests_waiting$", "as": ADAPTER_METRIC},
            "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)"}
