"""The generated rule files and configs: valid, naming only exported metrics, every alert
documented; Alertmanager routes each tier where the spec says. That the committed files are
current is tests/inferwatch/test_generate.py's golden test."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.alerts import generate, spec
from inferwatch.alerts.generate import RULES_DIR, rule_files
from inferwatch.dashboards import uids
from inferwatch.catalog import exposed
from inferwatch.deploy.monitoring import DEPLOY_DIR
from tests.support.promql import metric_names

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "alerts" / "runbooks"
AM_CONFIG = DEPLOY_DIR / "alertmanager" / "alertmanager.yml"


def all_rules() -> list[dict]:
    return [r for doc in rule_files().values() for g in doc["groups"] for r in g["rules"]]


def alerting_rules() -> list[dict]:
    return [r for r in all_rules() if "alert" in r]


def test_metric_name_parser_sees_through_promql():
    assert metric_names('sum by (model) (rate(a_total{x="y"}[5m])) / on (model) b > 0.5 unless c offset 10m') \
        == {"a_total", "b", "c"}


def test_every_rule_reads_only_metrics_the_stack_exports_or_records():
    recorded = {r["record"] for r in all_rules() if "record" in r}
    known = set(exposed()) | recorded
    for rule in all_rules():
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('alert') or rule.get('record')} reads {unknown}, which nothing exports"


def test_every_alert_is_documented_and_linked():
    for rule in alerting_rules():
        name, notes = rule["alert"], rule["annotations"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info", "none"), name
        assert notes["summary"] and notes["description"], name
        assert notes["runbook_url"] == f"{spec.RUNBOOK_BASE_URL}/{name}.md", name
        runbook = RUNBOOKS / f"{name}.md"
        assert runbook.is_file(), f"no runbook for {name}"
        text = runbook.read_text()
        for section in ("## Meaning", "## Confirm", "## Mitigate"):
            assert section in text, f"{runbook.name} lacks {section}"
        if "dashboard_url" in notes:
            assert notes["dashboard_url"].rsplit("/", 1)[1] in vars(uids).values(), name
    assert {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"} == {r["alert"] for r in alerting_rules()}


def test_pages_are_what_the_issue_lists():
    pages = {r["alert"] for r in alerting_rules() if r["labels"]["severity"] == "critical"}
    assert {"SLOErrorBudgetBurn", "VLLMDown", "GatewayDown", "GatewayUpstreamDown", "GPUFatalXID", "GPUDeviceFailed",
            "GPUUncorrectableECC", "GPURowRemapFailure", "InferwatchCrashLooping", "ABCanaryHurtingUsers",
            # the monitoring itself: rules that fail, alerts that cannot leave, a disk about to fill
            "PrometheusRuleFailures", "PrometheusErrorSendingAlertsToAnyAlertmanager",
            "AlertmanagerClusterFailedToSendAlerts", "HostFilesystemFillingUpFast"} == pages


def test_cap_for_shortens_only_longer_durations():
    capped = generate.cap_for(rule_files(), "2m")
    fors = [r["for"] for doc in capped.values() for g in doc["groups"] for r in g["rules"] if "for" in r]
    assert set(fors) == {"1m", "2m"}


def test_promtool_accepts_rules_and_config(tmp_path):
    subprocess.run(["promtool", "check", "rules", *map(str, sorted(RULES_DIR.glob("*.yml")))], check=True,
                   capture_output=True)
    subprocess.run(["promtool", "check", "config", "--syntax-only", str(DEPLOY_DIR / "prometheus" / "prometheus.yml")],
                   check=True, capture_output=True)


def test_amtool_accepts_the_alertmanager_config():
    result = subprocess.run(["amtool", "check-config", str(AM_CONFIG)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 receivers" in result.stdout


@pytest.mark.parametrize(("labels", "receiver"), [
    ({"alertname": "VLLMDown", "severity": "critical", "model": "m"}, "pager"),
    ({"alertname": "SLOErrorBudgetBurn", "severity": "critical", "slo": "ttft"}, "pager"),
    ({"alertname": "DriftDetected", "severity": "warning"}, "ticket"),
    ({"alertname": "GPUPowerCapped", "severity": "info"}, "null"),
    ({"alertname": "Watchdog", "severity": "none"}, "deadman"),
    ({"alertname": "VLLMModelUnavailable", "severity": "none", "model": "m"}, "null"),
    ({"alertname": "SomethingNew"}, "ticket"),
])
def test_amtool_routes_each_tier(labels, receiver):
    result = subprocess.run(["amtool", "config", "routes", "test", f"--config.file={AM_CONFIG}",
                             f"--verify.receivers={receiver}", *(f"{k}={v}" for k, v in labels.items())],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_config_never_inlines_a_secret():
    doc = yaml.safe_load(AM_CONFIG.read_text())
    pd = doc["receivers"][0]["pagerduty_configs"][0]
    assert "routing_key" not in pd and pd["routing_key_file"].startswith("/run/secrets/")


def test_message_templates_render_every_alert_with_labels_and_runbook():
    """amtool renders the templates with its example notification (two alerts)."""
    result = subprocess.run(
        ["amtool", "template", "render", f"--template.glob={ROOT / 'alerts' / 'templates'}/*.tmpl",
         "--template.text", '{{ template "inferwatch.title" . }}\n{{ template "inferwatch.text" . }}'],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.match(r"^\[[A-Z]+(:\d+)?\] ", lines[0]), lines[0]
    assert sum(line.strip().startswith("labels: ") for line in lines) == 2
    assert sum(line.strip().startswith("runbook:") for line in lines) == 2
    assert "instance=foo.bar:1234" in result.stdout


def test_absent_guards_only_for_the_jobs_that_are_scraped():
    def guarded(files: dict) -> set[str]:
        return {r["labels"]["job"] for g in files["alerts.yml"]["groups"] if g["name"] == "inferwatch-absent"
                for r in g["rules"]}

    assert guarded(rule_files()) == {guard.job for guard in spec.ABSENT_GUARDS}
    assert guarded(rule_files(jobs={spec.JOB_GATEWAY, spec.JOB_VLLM})) == {spec.JOB_GATEWAY, spec.JOB_VLLM}
