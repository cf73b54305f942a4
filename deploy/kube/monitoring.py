"""What kube-prometheus-stack needs to watch inferwatch: scrape objects whose job names are
the rules', the rules themselves, the paging route, and the dashboards.

- Scrape objects set ``jobLabel`` to a label each Service (or exporter pod) carries with the
  rules' job name: the Operator's default job would be the Service's name.
- vLLM's series get ``model`` from its ``model_name`` (as compose's relabel), and its
  ``up`` gets the model from the pod's label, so VLLMDown and its inhibition name the model.
- vLLM's and the exporter's series get ``host``, the node their pod runs on: the cost rules
  give a vLLM the GPUs of its host (alerts/cost.py); a pod's address says nothing of its node.
- kube-prometheus-stack selects rules, monitors and Alertmanager configs by its
  ``release`` label: every such object carries ``Cluster.selector_labels``.
- The Operator confines an ``AlertmanagerConfig`` to alerts labelled with its namespace.
  inferwatch's alerts aggregate ``by (model, ...)``, which drops the target's namespace, so
  every alerting rule here carries ``namespace`` as a static label (the rule files outside
  Kubernetes do not: ``rules_for_namespace``).
- Each monitor is named after its job: the absent() guards find a monitor's scrape config
  (``serviceMonitor/<namespace>/<job>/<n>``) by that name.
- The meta-monitoring alerts (alerts/meta.py: Prometheus, Alertmanager, the host's disks and
  memory) are left out: kube-prometheus-stack ships the mixins they come from, scoped to its
  own components, while these select every Prometheus and Alertmanager series in the cluster
  and would page inferwatch's on-call for another team's receiver.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from inferwatch.alerts import routing
from inferwatch.alerts.meta import META_ALERTS
from inferwatch.deploy.kube import objects as o
from inferwatch.deploy.kube.settings import JOB_LABEL, PAGERDUTY_SECRET, SLACK_SECRET, Settings
from inferwatch.deploy.kube.workloads import DRIFT, EXPORTER, GATEWAY, VLLM
from inferwatch.deploy.monitoring import SCRAPE_INTERVAL

MONITORING = "monitoring"
DASHBOARD_LABEL = {"grafana_dashboard": "1"}  # what Grafana's sidecar (kube-prometheus-stack) watches
MODEL_LABEL = "inferwatch.dev/model"


def _meta(obj_name: str, settings: Settings, **extra: str) -> dict:
    meta = o.metadata(obj_name, MONITORING, **extra)
    meta["labels"] |= settings.cluster.selector_labels
    return meta


def service_monitor(component: str, settings: Settings, *, port: str = "http",
                    relabelings: list[dict] | None = None, metric_relabelings: list[dict] | None = None) -> dict:
    endpoint: dict = {"port": port, "path": "/metrics", "interval": SCRAPE_INTERVAL, "scheme": "http"}
    if relabelings:
        endpoint["relabelings"] = relabelings
    if metric_relabelings:
        endpoint["metricRelabelings"] = metric_relabelings
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": _meta(settings.jobs[component], settings),
            "spec": {"jobLabel": JOB_LABEL, "selector": {"matchLabels": {JOB_LABEL: settings.jobs[component]}},
                     "endpoints": [endpoint]}}


# the node a pod runs on, as ``host``: what the cost rules join vLLM and the GPUs by
HOST_RELABEL = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "host", "action": "replace"}


def vllm_relabels() -> tuple[list[dict], list[dict]]:
    """(target relabelings, metric relabelings): the model from the pod's label on every
    series including ``up``, and the pod's node as ``host``; vLLM's own ``model_name`` where
    it names one."""
    target = [{"sourceLabels": [f"__meta_kubernetes_pod_label_{_label_name(MODEL_LABEL)}"],
               "regex": "(.+)", "targetLabel": "model", "action": "replace"}, HOST_RELABEL]
    metric = [{"sourceLabels": ["model_name"], "regex": "(.+)", "targetLabel": "model", "action": "replace"}]
    return target, metric


def _label_name(label: str) -> str:
    """How Kubernetes discovery spells a label in a meta label name."""
    return "".join(c if c.isalnum() else "_" for c in label)


def exporter_pod_monitor(settings: Settings) -> dict:
    """A PodMonitor: the DaemonSet has no Service to select, and ``instance`` is the pod.
    Its node is both ``node`` (as kube-prometheus-stack's node series) and ``host`` (the cost
    rules' join with vLLM). ``honorLabels``: ``inferwatch_gpu_pod_info`` names the pod, namespace
    and container holding a GPU, which the scrape's own labels (the exporter's pod) would
    otherwise rename ``exported_*``; no other series of the exporter carries those labels."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": _meta(settings.jobs[EXPORTER], settings),
            "spec": {"jobLabel": JOB_LABEL, "selector": {"matchLabels": o.selector(EXPORTER)},
                     "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": SCRAPE_INTERVAL,
                                              "honorLabels": True,
                                              "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"],
                                                               "targetLabel": "node", "action": "replace"},
                                                              HOST_RELABEL]}]}}


def monitors(settings: Settings) -> list[dict]:
    target, metric = vllm_relabels()
    return [service_monitor(GATEWAY, settings), service_monitor(DRIFT, settings),
            service_monitor(VLLM, settings, relabelings=target, metric_relabelings=metric),
            exporter_pod_monitor(settings)]


LEFT_OUT = frozenset(alert.name for alert in META_ALERTS)


def rules_for_namespace(rule_texts: list[str], namespace: str) -> list[dict]:
    """The groups of the rule files, each alerting rule labelled with ``namespace``, the
    meta-monitoring alerts (``LEFT_OUT``) left out."""
    groups = []
    for text in rule_texts:
        for group in yaml.safe_load(text)["groups"]:
            rules = [{**rule, "labels": {**rule.get("labels", {}), "namespace": namespace}} if "alert" in rule
                     else rule for rule in group["rules"] if rule.get("alert") not in LEFT_OUT]
            groups.append({**group, "rules": rules})
    return groups


def prometheus_rule(obj_name: str, rule_texts: list[str], settings: Settings) -> dict:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": _meta(obj_name, settings), "spec": {"groups": rules_for_namespace(rule_texts, settings.namespace)}}


def _webhook(url: str, send_resolved: bool = True) -> dict:
    return {"url": url, "sendResolved": send_resolved, "maxAlerts": routing.MAX_ALERTS_PER_WEBHOOK}


_MATCHER = re.compile(r'^([a-zA-Z_][a-zA-Z0-9_]*)(=~|!~|!=|=)"(.*)"$')


def _matcher(expr: str) -> dict:
    """routing's ``name="value"`` (``=~``, ``!=``, ``!~``) as the CRD's matcher object."""
    match = _MATCHER.match(expr)
    assert match is not None, expr  # the settings' matchers and routing's own all have this form
    return {"name": match[1], "value": match[3], "matchType": match[2]}


CAMEL = {"group_wait": "groupWait", "group_interval": "groupInterval", "repeat_interval": "repeatInterval",
         "group_by": "groupBy"}


def _route(route: dict) -> dict:
    """One of routing's routes (Alertmanager's spelling) in the CRD's."""
    return {"receiver": route["receiver"], "matchers": [_matcher(m) for m in route["matchers"]],
            **{CAMEL[key]: value for key, value in route.items() if key in CAMEL}}


def alertmanager_config(settings: Settings) -> dict:
    """routing.alertmanager_config's tree in the AlertmanagerConfig CRD's spelling, with the
    receivers at ``settings.paging``; the Operator adds ``namespace="<this namespace>"`` to
    every route and inhibition. No templates: the Operator's Alertmanager has not got ours."""
    config = routing.alertmanager_config(routing.Receivers("", "", ""), "", settings.routing)
    top = config["route"]
    inhibit = [{"sourceMatch": [_matcher(m) for m in rule["source_matchers"]],
                "targetMatch": [_matcher(m) for m in rule["target_matchers"]], "equal": rule["equal"]}
               for rule in config["inhibit_rules"]]
    paging = settings.paging
    return {"apiVersion": "monitoring.coreos.com/v1alpha1", "kind": "AlertmanagerConfig",
            "metadata": _meta("inferwatch", settings),
            "spec": {"route": {"receiver": top["receiver"],
                               **{CAMEL[key]: value for key, value in top.items() if key in CAMEL},
                               "routes": [_route(r) for r in top["routes"]]},
                     "inhibitRules": inhibit,
                     "receivers": [_receiver("pager", paging.pager_webhook, settings, page=True),
                                   _receiver("ticket", paging.ticket_webhook, settings, page=False),
                                   {"name": "deadman", "webhookConfigs": [_webhook(paging.heartbeat_url, False)]},
                                   {"name": "null"}]}}


def _pagerduty() -> dict:
    return {"routingKey": {"name": PAGERDUTY_SECRET.name, "key": "routing_key"}, "sendResolved": True,
            "severity": "critical"}


def _receiver(receiver: str, hook: str, settings: Settings, *, page: bool) -> dict:
    """The development pager's webhook, and the settings' receivers (``routing.receivers``):
    secrets by reference, from Secrets the user creates."""
    extra = settings.routing.receivers
    out: dict = {"name": receiver, "webhookConfigs": [_webhook(hook)]}
    if extra.webhook is not None and (page or extra.webhook.tickets):
        out["webhookConfigs"].append(_webhook(extra.webhook.url))
    if extra.slack is not None and (page or extra.slack.tickets):
        out["slackConfigs"] = [{"apiURL": {"name": SLACK_SECRET.name, "key": "api_url"},
                                "channel": extra.slack.channel, "sendResolved": True}]
    if extra.pagerduty is not None and page:
        out["pagerdutyConfigs"] = [_pagerduty()]
    return out


def pagerduty_patch() -> list[dict]:
    """A JSON patch (the CRD has no strategic merge) adding PagerDuty to the pager receiver."""
    return [{"op": "add", "path": "/spec/receivers/0/pagerdutyConfigs", "value": [_pagerduty()]}]


def dashboard_config_maps(dashboards: Mapping[Path, str], settings: Settings) -> list[dict]:
    return [{"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": _meta(f"{path.stem}-dashboard", settings, **DASHBOARD_LABEL),
             "data": {path.name: dashboards[path]}} for path in sorted(dashboards, key=lambda p: p.name)]
