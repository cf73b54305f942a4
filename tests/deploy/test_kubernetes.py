"""deploy/kubernetes: the generated rules and dashboards, wrapped for the Prometheus Operator
and Grafana's sidecar, loadable (no cluster here: promtool checks the rule groups, and the
objects are checked against the fields the operator and kubectl require). That they are
current is tests/inferwatch/test_generate.py's golden test."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from inferwatch.alerts import dcgm
from inferwatch.alerts.generate import RULES_DIR
from inferwatch.dashboards.generate import JSON_DIR
from inferwatch.deploy.manifests import K8S_DIR

LAST_APPLIED_LIMIT = 262_144  # kubectl apply keeps the object in an annotation of at most 256 KiB
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _objects(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S_DIR / name).read_text()) if d]


def test_prometheus_rules_carry_exactly_the_rule_files_and_pass_promtool(tmp_path):
    for name, sources in (("prometheus-rules.yaml", sorted(RULES_DIR.glob("*.yml"))),
                          ("prometheus-rules-dcgm-exporter.yaml", [dcgm.OUT])):
        [rule] = _objects(name)
        assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
        assert DNS_LABEL.match(rule["metadata"]["name"])
        assert rule["spec"]["groups"] == [g for f in sources for g in yaml.safe_load(f.read_text())["groups"]]
        extracted = tmp_path / f"{name}.rules.yml"
        extracted.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        result = subprocess.run(["promtool", "check", "rules", str(extracted)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_dashboards_are_config_maps_grafanas_sidecar_loads():
    maps = _objects("grafana-dashboards.yaml")
    assert len(maps) == len(list(JSON_DIR.glob("*.json")))
    for cm in maps:
        assert (cm["apiVersion"], cm["kind"]) == ("v1", "ConfigMap")
        assert DNS_LABEL.match(cm["metadata"]["name"]) and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        [(file_name, text)] = cm["data"].items()
        assert json.loads(text) == json.loads((JSON_DIR / file_name).read_text())
        assert len(json.dumps(cm)) < LAST_APPLIED_LIMIT, cm["metadata"]["name"]
