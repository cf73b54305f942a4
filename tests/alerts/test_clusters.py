"""Rules over several clusters' samples, as a central store holds them: what is one cluster's
stays that cluster's. Every promtool test of tests/alerts also runs with its series in one
cluster (``tests.alerts.promtool.in_cluster``); these put two clusters side by side."""

from __future__ import annotations

import pytest
import yaml

from inferwatch.alerts import clusters, generate
from tests.alerts.promtool import RULE_FILES, expected, run_promtool, selector

GW = {"job": "inferwatch-gateway", "instance": "gw:8080"}
VLLM = {"job": "vllm", "instance": "vllm:8000", "model": "m1"}  # the same names in both clusters
CHAT = {**GW, "model": "m1", "variant": "v1", "route": "/v1/chat/completions"}


def test_keep_adds_the_cluster_to_every_grouping_and_match():
    assert clusters.keep("sum(rate(x[5m])) > 0 unless on () max(up{job=\"a\"})") == \
        'sum by (cluster) (rate(x[5m])) > 0 unless on (cluster) max by (cluster) (up{job="a"})'
    assert clusters.keep("sum by (model) (x) / on (model) group_left (slo) y") == \
        "sum by (cluster, model) (x) / on (cluster, model) group_left (slo) y"
    # kept already, or kept by nature: without, ignoring, a label inside a matcher or string
    same = ['max without (pod) (x) + ignoring (le) y', 'sum by (cluster) (x{by="on (a)"})',
            'count_over_time(up[5m] offset 1h)', 'x{sum="1"} and on (cluster, a) y']
    for expr in same:
        assert clusters.keep(expr) == expr
    assert clusters.keep("topk(3, x)") == "topk by (cluster) (3, x)"


def test_keep_refuses_the_trailing_grouping_form_it_cannot_rewrite():
    with pytest.raises(ValueError, match="trailing grouping"):
        clusters.keep("sum(x) by (model)")


def test_select_filters_every_series_but_constants_and_label_names():
    matcher = 'cluster=~"$cluster"'
    assert clusters.select('sum by (model) (rate(x{a="b"}[5m])) / on (model) group_left y', matcher) == \
        'sum by (model) (rate(x{cluster=~"$cluster", a="b"}[5m])) / on (model) group_left y{cluster=~"$cluster"}'
    assert clusters.select("x / c", matcher, frozenset({"c"})) == 'x{cluster=~"$cluster"} / c'
    assert clusters.select('label_replace(x{}, "to", "$1", "from", "(.*)")', matcher) == \
        'label_replace(x{cluster=~"$cluster"}, "to", "$1", "from", "(.*)")'


def test_every_committed_rule_keeps_the_cluster():
    """``keep`` changes nothing more in what is committed: no rule left to merge clusters."""
    for path in (*RULE_FILES, generate.RULES_DIR.parent / "compat" / "dcgm-exporter.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                assert clusters.keep(rule["expr"]) == rule["expr"], (path.name, rule.get("alert") or rule["record"])


def _in(cluster: str, labels: dict[str, str]) -> dict[str, str]:
    return {**labels, "cluster": cluster}


def _two_clusters_doc(rule_files: list[str]) -> dict:
    """The same model, on targets of the same names, in two clusters: east's vLLM dies at 10m
    and its requests fail from then; west serves throughout. West has no gateway target."""
    series = {
        selector("up", _in("east", VLLM)): "1x10 0x30",
        selector("vllm:num_requests_running", _in("east", VLLM)): "0x10 _x30",
        selector("up", _in("west", VLLM)): "1x40",
        selector("vllm:num_requests_running", _in("west", VLLM)): "0x40",
        selector("up", _in("east", GW)): "1x40",
        selector("inferwatch_gateway_requests_total", _in("east", {**CHAT, "status_class": "2xx"})): "0+600x10 6000x30",
        selector("inferwatch_gateway_requests_total", _in("east", {**CHAT, "status_class": "5xx"})): "0x10 0+600x30",
        selector("inferwatch_gateway_requests_total", _in("west", {**CHAT, "status_class": "2xx"})): "0+600x40",
        selector("inferwatch_gateway_requests_total", _in("west", {**CHAT, "status_class": "5xx"})): "0x40",
    }
    down = expected("VLLMDown", {"alertname": "VLLMDown", **_in("east", VLLM), "severity": "critical"}, "2")
    unavailable = expected("VLLMModelUnavailable", {"alertname": "VLLMModelUnavailable", "cluster": "east",
                                                    "model": "m1", "severity": "none"}, "1")

    def absent(cluster: str, job: str) -> dict:
        return expected("InferwatchTargetAbsent", {"alertname": "InferwatchTargetAbsent", "cluster": cluster,
                                                   "job": job, "metric": "up", "severity": "warning"}, "1")

    checks = [{"eval_time": "9m", "alertname": "VLLMDown", "exp_alerts": []},
              {"eval_time": "12m", "alertname": "VLLMDown", "exp_alerts": [down]},
              # what inhibits the outage's own SLO pages: east's only
              {"eval_time": "25m", "alertname": "VLLMModelUnavailable", "exp_alerts": [unavailable]},
              # a guard per cluster: west has no gateway; neither has GPU metrics nor an exporter
              {"eval_time": "25m", "alertname": "InferwatchTargetAbsent",
               "exp_alerts": [absent("west", "inferwatch-gateway"), absent("east", "inferwatch-exporter"),
                              absent("west", "inferwatch-exporter")]}]
    fast = 'ALERTS{alertname="SLOErrorBudgetBurn",alertstate="firing",slo="availability",burn="fast"}'
    slo = [{"expr": f"count by (cluster) ({fast})", "eval_time": "25m",
            "exp_samples": [{"labels": '{cluster="east"}', "value": 1}]},
           {"expr": 'inferwatch_slo:sli_error:ratio_rate5m{slo="availability"}', "eval_time": "25m",
            "exp_samples": [{"labels": '{__name__="inferwatch_slo:sli_error:ratio_rate5m", cluster="east", model="m1", '
                                       'slo="availability"}', "value": 1},
                            {"labels": '{__name__="inferwatch_slo:sli_error:ratio_rate5m", cluster="west", model="m1", '
                                       'slo="availability"}', "value": 0}]}]
    return {"rule_files": rule_files, "evaluation_interval": "1m",
            "tests": [{"name": "one cluster's outage among two", "interval": "1m",
                       "input_series": [{"series": k, "values": v} for k, v in series.items()],
                       "alert_rule_test": checks, "promql_expr_test": slo}]}


def test_the_same_model_down_in_one_of_two_clusters_pages_once_naming_it_and_burns_only_its_slo(tmp_path):
    result = run_promtool(_two_clusters_doc([str(f) for f in RULE_FILES]), tmp_path, clustered=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_same_rules_without_the_cluster_would_merge_the_two(tmp_path, monkeypatch):
    """The test above can fail: rules generated without ``keep`` find m1 available while only
    west serves it (so nothing inhibits east's outage's SLO pages) and burn one SLO over both
    clusters' requests."""
    monkeypatch.setattr(clusters, "keep", lambda expr, label="cluster": expr)
    generate.write(generate.rule_files(), tmp_path / "rules")
    result = run_promtool(_two_clusters_doc([str(p) for p in sorted((tmp_path / "rules").glob("*.yml"))]),
                          tmp_path, clustered=False)
    assert result.returncode != 0
    failures = result.stdout + result.stderr
    assert "alertname: VLLMModelUnavailable" in failures and "SLOErrorBudgetBurn" in failures
