"""Run alert scenarios through ``promtool test rules`` against the generated rule files.

A scenario states input series, when the alert must be silent, when it must fire (with
which labels and which rendered value) and when it must have resolved. The expected
annotations are the rule's own templates with those labels and that value filled in, so
a template that references a label the alert does not carry shows up as a mismatch.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from inferwatch.alerts import clusters
from inferwatch.alerts.generate import RULES_DIR
from tests.support.promql import metric_names

RULE_FILES = sorted(RULES_DIR.glob("*.yml"))
OTHER_CLUSTER = "eu-west"
# what belongs to no cluster: an alert of a constant expression, records of constants
UNCLUSTERED_ALERTS = {"Watchdog"}
CONSTANTS = frozenset({"inferwatch_slo:objective:ratio", "inferwatch_slo:error_budget:ratio",
                       "inferwatch_cost:gpu_hour_price:dollars"})
BASE = {"job": "test", "instance": "host:1"}
GPU = {"job": "inferwatch-exporter", "instance": "node1:9400", "gpu": "0", "uuid": "GPU-aaaa",
       "name": "NVIDIA H100", "pci_bus_id": "00000000:01:00.0"}


@dataclass
class Scenario:
    name: str
    alert: str
    series: dict[str, str]
    fires_at: str
    labels: dict[str, str]  # the alert's labels, rule labels (severity, ...) included
    value: str  # how the templates render $value
    quiet_at: tuple[str, ...] = ()
    resolved_at: str | None = None
    interval: str = "1m"
    extra_firing: list[dict] = field(default_factory=list)  # other alerts of the same name at fires_at


def _rules() -> list[dict]:
    return [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r]


def rule_for(alert: str, labels: dict[str, str]) -> dict:
    """The rule whose own labels the alert carries (several SLO rules share a name)."""
    candidates = [r for r in _rules() if r["alert"] == alert
                  and all(labels.get(k) == v for k, v in r.get("labels", {}).items())]
    assert len(candidates) == 1, f"{alert} {labels}: {len(candidates)} matching rules"
    return candidates[0]


def render(template: str, labels: dict[str, str], value: str) -> str:
    out = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m[1], ""), template)
    return re.sub(r"\{\{ \$value( \| \w+)? \}\}", value, out)


def expected(alert: str, labels: dict[str, str], value: str) -> dict:
    rule = rule_for(alert, labels)
    return {"exp_labels": labels,
            "exp_annotations": {k: render(v, labels, value) for k, v in rule["annotations"].items()}}


def promtool_doc(scenarios: list[Scenario]) -> dict:
    tests = []
    for s in scenarios:
        checks = [{"eval_time": t, "alertname": s.alert, "exp_alerts": []} for t in s.quiet_at]
        checks.append({"eval_time": s.fires_at, "alertname": s.alert,
                       "exp_alerts": [expected(s.alert, s.labels, s.value), *s.extra_firing]})
        if s.resolved_at:
            checks.append({"eval_time": s.resolved_at, "alertname": s.alert, "exp_alerts": []})
        tests.append({"name": s.name, "interval": s.interval,
                      "input_series": [{"series": k, "values": v} for k, v in s.series.items()],
                      "alert_rule_test": checks})
    return {"rule_files": [str(f) for f in RULE_FILES], "evaluation_interval": "1m", "tests": tests}


def _labelled(labels: str, matcher: str) -> str:
    """A series or label set (``name{...}``, ``{...}``) with one more label."""
    if labels.startswith("{"):
        return "{" + matcher + ("" if labels == "{}" else ", ") + labels[1:]
    return clusters.select(labels, matcher)


def in_cluster(doc: dict, cluster: str = OTHER_CLUSTER) -> dict:
    """The same tests with every series from ``cluster``, as a central store holds them (a
    cluster's Prometheus sends its ``cluster`` external label with every sample): the alerts
    and records they expect carry it too, and the expressions they query keep it (``keep``),
    but for the series of no cluster (the Watchdog, records of constants)."""
    matcher = f'{clusters.CLUSTER}="{cluster}"'
    tests = []
    for test in doc["tests"]:
        test = {**test, "input_series": [{**s, "series": _labelled(s["series"], matcher)}
                                         for s in test.get("input_series", [])]}
        if "alert_rule_test" in test:
            test["alert_rule_test"] = [
                {**check, "exp_alerts": [{**a, "exp_labels": {**a["exp_labels"], clusters.CLUSTER: cluster}}
                                         if check["alertname"] not in UNCLUSTERED_ALERTS else a
                                         for a in check.get("exp_alerts", [])]}
                for check in test["alert_rule_test"]]
        if "promql_expr_test" in test:
            test["promql_expr_test"] = [
                {**check, "expr": clusters.keep(clusters.select(check["expr"], matcher, CONSTANTS)),
                 "exp_samples": [{**e, "labels": _labelled(e["labels"], matcher)}
                                 if not metric_names(check["expr"]) <= CONSTANTS else e
                                 for e in check.get("exp_samples", [])]}
                for check in test["promql_expr_test"]]
        tests.append(test)
    return {**doc, "tests": tests}


def run_promtool(doc: dict, tmp: Path, clustered: bool = True) -> subprocess.CompletedProcess:
    """The tests as written (one cluster: no ``cluster`` label) and, at the same time, as a
    central store sees one cluster among several (``in_cluster``): both must pass.
    ``clustered`` False runs only the first: a dashboard's query, which sums the clusters
    ``$cluster`` chose, is not a rule."""
    variants = [("promtool-test.yml", doc)] + [("promtool-test-in-cluster.yml", in_cluster(doc))] * clustered
    runs = []
    for name, variant in variants:
        path = tmp / name
        path.write_text(yaml.safe_dump(variant, sort_keys=False, width=200))
        runs.append(subprocess.Popen(["promtool", "test", "rules", str(path)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True))
    outs = [run.communicate(timeout=600) for run in runs]
    return subprocess.CompletedProcess(runs[0].args, max(run.returncode for run in runs),
                                       "".join(o for o, _ in outs), "".join(e for _, e in outs))


def selector(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
