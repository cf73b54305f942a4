"""The dashboards' threshold lines and words agree with the generated alert rules they explain.

Read from the generated rules, not from the spec the dashboards import: a number retyped in
a dashboard, or an alert whose expression stops using the spec's constant, fails here.
"""

from __future__ import annotations

import re

from inferwatch.alerts.generate import rule_files
from inferwatch.dashboards import uids
from inferwatch.dashboards.generate import dashboards

DOCS = dashboards()
RULES = [r for doc in rule_files().values() for g in doc["groups"] for r in g["rules"]]


def panel(uid: str, title: str) -> dict:
    [found] = [p for p in DOCS[uid]["panels"] if p.get("title") == title]
    return found


def steps(uid: str, title: str) -> dict[str, float]:
    """Threshold colour -> value of a panel."""
    return {s["color"]: s["value"] for s in panel(uid, title)["fieldConfig"]["defaults"]["thresholds"]["steps"]}


def alert(name: str, **labels: str) -> dict:
    [found] = [r for r in RULES if r.get("alert") == name and labels.items() <= r["labels"].items()]
    return found


def number_after(pattern: str, expr: str) -> float:
    match = re.search(pattern + r"\s*(?:>|>=)\s*([0-9.]+)", expr)
    assert match, f"{pattern} compared with no number in {expr}"
    return float(match[1])


def budget(slo: str) -> float:
    [expr] = [r["expr"] for r in RULES if r.get("record") == "inferwatch_slo:error_budget:ratio"
              and r["labels"]["slo"] == slo]
    return float(re.fullmatch(r"vector\(([0-9.]+)\)", expr)[1])


def page_burn_rates(slo: str) -> list[float]:
    """The burn rates at which the page tier's window pairs fire (one alert holds them all)."""
    [page] = [r for r in RULES if r.get("alert") == "SLOErrorBudgetBurn" and r["labels"]["slo"] == slo
              and r["labels"]["severity"] == "critical"]
    thresholds = {float(t) for t in re.findall(r"ratio_rate\w+\{[^}]*\}\s*>\s*([0-9.]+)", page["expr"])}
    assert len(thresholds) == 2, page["expr"]
    return sorted(round(t / budget(slo), 6) for t in thresholds)


def test_error_ratio_panel_marks_the_availability_budget_and_its_fastest_page():
    fastest = alert("SLOErrorBudgetBurn", slo="availability", burn="fast")
    assert steps(uids.SERVING, "Error ratio (5xx)") == {
        "green": None, "orange": budget("availability"), "red": number_after(r"\}", fastest["expr"])}
    assert f"allows {budget('availability'):.1%}" in panel(uids.SERVING, "Error ratio (5xx)")["description"]


def test_ttft_panel_marks_the_ttft_slo_threshold():
    [good] = [r["expr"] for r in RULES if r.get("record") == "inferwatch_slo:sli_errors:rate5m"
              and r["labels"]["slo"] == "ttft"]
    threshold = float(re.search(r'time_to_first_token_seconds_bucket\{le="([0-9.]+)"\}', good)[1])
    assert steps(uids.SERVING, "Time to first token")["red"] == threshold
    assert f"TTFT SLO is {threshold:g} s" in panel(uids.SERVING, "Time to first token")["description"]


def test_kv_cache_panel_marks_where_saturation_alerts():
    expr = alert("VLLMKVCacheSaturated")["expr"]
    assert steps(uids.SERVING, "KV-cache usage")["red"] == number_after(r"kv_cache_usage_perc\)", expr)


def test_burn_rate_panels_mark_where_paging_starts_and_where_it_is_certain():
    rates = page_burn_rates("availability")
    assert rates == page_burn_rates("ttft") == page_burn_rates("e2e_latency")
    assert steps(uids.SLOS, "Current burn rate")["red"] == max(rates)
    assert steps(uids.SLOS, "Burn rate per window ($slo)")["red"] == min(rates)
    description = panel(uids.SLOS, "Burn rate per window ($slo)")["description"]
    assert all(f"{rate:g}x" in description for rate in rates), description


def test_snapshot_age_panel_marks_where_the_stale_snapshot_alert_fires():
    expr = alert("GPUExporterSnapshotStale")["expr"]
    assert steps(uids.GPUS, "Snapshot age")["red"] == number_after(r"snapshot_timestamp_seconds", expr)


def test_drift_verdict_panel_states_the_alerts_duration_and_record_floor():
    rule = alert("DriftDetected")
    floor = int(number_after(r"window_records", rule["expr"]))
    description = panel(uids.DRIFT, "Drifted features per segment")["description"]
    assert f"for {rule['for']}, with at least {floor} records" in description


def test_firing_alerts_panels_leave_out_exactly_the_meta_alerts():
    meta = sorted(r["alert"] for r in RULES if r.get("alert") and r["labels"]["severity"] == "none")
    exprs = [t["expr"] for title in ("Alerts firing", "Alerts firing by severity")
             for t in panel(uids.SLOS, title)["targets"]]
    for expr in exprs:
        [excluded] = re.findall(r'alertname!~"([^"]+)"', expr)
        assert sorted(excluded.split("|")) == meta, expr
