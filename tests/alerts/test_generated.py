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
from inferwatch.alerts.catalog import exposed
from inferwatch.alerts.generate import RULES_DIR, rule_files
from inferwatch.dashboards import uids
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
        assert notes["runbook_url"] == f"{spec.DEFAULT.settings.links.runbook_url}/{name}.md", name
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
            "TenantBudgetSpent",  # a tenant marked critical whose budget is spent: its requests are refused
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


def test_alertmanager_config_never_inlines_a_secret_and_pages_pagerduty_only_when_chosen():
    assert "pagerduty" not in AM_CONFIG.read_text()  # the default: no key, no PagerDuty receiver
    with_pagerduty = AM_CONFIG.with_name("alertmanager-pagerduty.yml")
    result = subprocess.run(["amtool", "check-config", str(with_pagerduty)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    pd = yaml.safe_load(with_pagerduty.read_text())["receivers"][0]["pagerduty_configs"][0]
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


def test_links_and_an_itl_objective_on_some_models_come_from_the_settings(tmp_path):
    from inferwatch.alerts.spec import build
    from inferwatch.config.load import parse

    settings = parse("""
links: {grafana_url: "https://grafana.example.com", runbook_url: "https://wiki.example.com/runbooks/"}
models:
  - {name: llama-3.1-8b}
  - {name: qwen, slos: [availability, itl]}
  - {name: other, slos: [availability]}
slos:
  - {name: availability, sli: availability, objective: 0.999}
  - {name: itl, sli: itl, objective: 0.99, threshold_s: 0.1}
""")
    files = rule_files(build(settings))
    alerts = [r for doc in files.values() for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert all(r["annotations"]["runbook_url"] == f"https://wiki.example.com/runbooks/{r['alert']}.md" for r in alerts)
    assert {r["annotations"]["dashboard_url"].rsplit("/d/", 1)[0] for r in alerts if "dashboard_url" in r["annotations"]} \
        == {"https://grafana.example.com"}
    itl = [r for r in alerts if r["alert"] == "SLOErrorBudgetBurn" and r["labels"]["slo"] == "itl"]
    assert [r["labels"]["burn"] for r in itl] == ["fast", "slow"]
    records = [r for doc in files.values() for g in doc["groups"] for r in g["rules"] if r.get("labels", {}).get("slo") == "itl"]
    assert 'model=~"llama-3\\\\.1-8b|qwen"' in records[0]["expr"] and 'le="0.1"' in records[0]["expr"]
    availability = [r for doc in files.values() for g in doc["groups"] for r in g["rules"]
                    if r.get("labels", {}).get("slo") == "availability"]
    assert "model=~" not in availability[0]["expr"], "an SLO every model holds also covers models not listed"
    for name, doc in files.items():  # promtool accepts them
        (tmp_path / name).write_text(generate.render(doc))
    subprocess.run(["promtool", "check", "rules", *map(str, sorted(tmp_path.glob("*.yml")))], check=True,
                   capture_output=True)
    assert not any(r.get("labels", {}).get("slo") == "itl" for r in all_rules())  # off by default


def test_the_heartbeat_goes_where_it_is_configured_and_never_sends_resolutions(tmp_path):
    from inferwatch.alerts.routing import Receivers, alertmanager_config

    doc = alertmanager_config(Receivers("http://p/pager", "http://p/ticket", "https://hc-ping.com/uuid"), "/t")
    [deadman] = [r for r in doc["receivers"] if r["name"] == "deadman"]
    assert deadman["webhook_configs"] == [{"url": "https://hc-ping.com/uuid", "send_resolved": False,
                                          "max_alerts": 1000}]


def test_no_pagerduty_receiver_without_a_key():
    from inferwatch.alerts.routing import Receivers, alertmanager_config

    without = alertmanager_config(Receivers("http://p/pager", "http://p/ticket", "http://p/deadman"), "/t")
    assert all("pagerduty_configs" not in r for r in without["receivers"])
    with_key = alertmanager_config(Receivers("http://p/pager", "http://p/ticket", "http://p/deadman", "/run/k"), "/t")
    assert [r["name"] for r in with_key["receivers"] if "pagerduty_configs" in r] == ["pager"]
