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

from inferwatch.alerts.generate import RULES_DIR

RULE_FILES = sorted(RULES_DIR.glob("*.yml"))
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


def run_promtool(doc: dict, tmp: Path) -> subprocess.CompletedProcess:
    path = tmp / "promtool-test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=200))
    return subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=600)


def selector(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
