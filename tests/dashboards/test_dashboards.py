"""The generated dashboards: well-formed, reading only exported metrics correctly (that the
committed JSON is current is tests/inferwatch/test_generate.py's golden test)."""

from __future__ import annotations

import json
import re

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dash

from inferwatch.alerts.catalog import exposed, kind_of
from inferwatch.alerts.generate import rule_files
from inferwatch.alerts.spec import DEFAULT
from inferwatch.dashboards import uids
from inferwatch.dashboards.generate import INTERVAL_ONLY, dashboards
from tests.support.promql import metric_names, range_functions

DOCS = dashboards()
RECORDED = {r["record"] for doc in rule_files().values() for g in doc["groups"] for r in g["rules"] if "record" in r}


def panels(doc: dict) -> list[dict]:
    return [p for p in doc["panels"] if p["type"] != "row"]


def exprs(doc: dict) -> list[str]:
    return [t["expr"] for p in panels(doc) for t in p["targets"]]


def test_uids_are_the_ones_alerts_link_to():
    assert set(DOCS) == {uids.SERVING, uids.GPUS, uids.DRIFT, uids.SLOS, uids.TENANTS}
    linked = {a.dashboard for a in DEFAULT.alerts if a.dashboard}
    assert linked <= set(DOCS)


@pytest.mark.parametrize("uid", sorted(DOCS))
def test_every_panel_has_datasource_unit_title_and_queries(uid):
    doc = DOCS[uid]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels(doc):
        assert p["title"], p
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), p["title"]
        assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
        assert p["gridPos"]["w"] > 0 and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]


@pytest.mark.parametrize("uid", sorted(DOCS))
def test_variables_and_links(uid):
    doc = DOCS[uid]
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names[0] == "datasource"
    want = {"host", "gpu"} if uid == uids.GPUS else {"model"}
    assert want <= set(names), names
    # instance variables are per kind of target, so one never filters another's panels empty
    instances = {uids.SERVING: {"gateway", "vllm"}, uids.DRIFT: {"drift"}, uids.GPUS: {"host"}}.get(uid, set())
    assert instances <= set(names), names
    if uid in (uids.SERVING, uids.DRIFT):
        assert "variant" in names
    assert doc["links"] and doc["links"][0]["tags"] == ["inferwatch"]
    used = " ".join(exprs(doc))
    for name in names[1:]:
        assert f"${name}" in used, f"variable {name} is not used by any panel"


@pytest.mark.parametrize("uid", sorted(DOCS))
def test_queries_read_declared_metrics_the_right_way(uid):
    known = set(exposed()) | RECORDED
    for expr in exprs(DOCS[uid]):
        unknown = metric_names(expr) - known
        assert not unknown, f"{expr} reads {unknown}, which nothing exports"
        for function, name in range_functions(expr):
            if name in RECORDED:
                continue
            assert kind_of(name) in ("counter", "histogram"), f"{function}() over the gauge {name}: {expr}"
        for match in re.finditer(r"histogram_quantile\(\s*[\d.]+\s*,\s*(\w+)\s*(by\s*\(([^)]*)\))?", expr):
            labels = [x.strip() for x in (match[3] or "").split(",")]
            assert match[1] == "sum" and "le" in labels, f"histogram_quantile without sum by (le, ...): {expr}"


def test_checks_catch_what_they_should():
    assert range_functions("rate(vllm:kv_cache_usage_perc[5m])") == [("rate", "vllm:kv_cache_usage_perc")]
    assert kind_of("vllm:kv_cache_usage_perc") == "gauge"
    assert not re.search(r"histogram_quantile\(\s*[\d.]+\s*,\s*sum\s*by\s*\([^)]*le",
                         "histogram_quantile(0.9, rate(x_bucket[5m]))")


@pytest.mark.parametrize("uid", sorted(DOCS))
def test_json_loads_back_into_the_sdk_models_without_loss(uid):
    doc = DOCS[uid]
    again = json.loads(json.dumps(dash.Dashboard.from_json(doc), cls=JSONEncoder))
    # the SDK's model fills in its defaults for what the generator leaves out
    for link in again["links"]:
        assert link.pop("placement") == "inControlsMenu"
    for var in again["templating"]["list"]:
        for key in INTERVAL_ONLY if var["type"] != "interval" else ():
            var.pop(key)
    assert again == doc


def test_latency_panels_carry_exemplars():
    serving = DOCS[uids.SERVING]
    latency = [p for p in panels(serving) if p["title"] in ("Request latency", "Time to first token")]
    assert latency and all(t.get("exemplar") for p in latency for t in p["targets"])


def test_legends_name_their_series():
    for doc in DOCS.values():
        for p in panels(doc):
            for t in p["targets"]:
                legend = t.get("legendFormat", "")
                assert not re.search(r"(?<!\{)\{\w+\}(?!\})", legend), f"{p['title']}: {legend}"


def test_links_have_no_placement_so_grafana_12_3_shows_them():
    for doc in DOCS.values():
        assert all("placement" not in link for link in doc["links"]), doc["uid"]


def test_legends_use_one_label_per_template():
    """``{{model, variant}}`` is no template Grafana knows: it renders empty, and every series
    of the panel gets the same legend."""
    for doc in DOCS.values():
        for p in panels(doc):
            for t in p["targets"]:
                for template in re.findall(r"\{\{(.*?)\}\}", t.get("legendFormat", "")):
                    assert re.fullmatch(r"\s*[a-zA-Z_]\w*\s*", template), f"{p['title']}: {t['legendFormat']}"


def test_time_series_with_thresholds_draw_them():
    for doc in DOCS.values():
        for p in panels(doc):
            defaults = p["fieldConfig"]["defaults"]
            if p["type"] == "timeseries" and len(defaults["thresholds"]["steps"]) > 1:
                assert defaults["custom"]["thresholdsStyle"]["mode"] != "off", p["title"]


def test_all_models_means_the_listed_ones_not_unknown():
    from inferwatch.serving.metrics import UNKNOWN_MODEL

    for doc in DOCS.values():
        for var in doc["templating"]["list"]:
            if var["name"] == "model" and f'model!="{UNKNOWN_MODEL}"' in var["query"]:
                assert var["includeAll"] and not var.get("allValue"), doc["uid"]  # ".*" would bring it back


def test_all_is_sent_as_grafana_sends_it():
    """Grafana's Prometheus data source: the values joined as a regex, each escaped for a
    regex inside a PromQL string (``.`` becomes ``\\\\.``); one value alone, unbracketed."""
    from inferwatch.dashboards.queries import all_of

    assert all_of(["llama-3.1-8b", "tiny"]) == r"(llama-3\\.1-8b|tiny)"
    assert all_of(["tiny"]) == "tiny"


def test_the_xid_panel_counts_the_first_xid_of_a_gpu(tmp_path):
    """An XID counter is born at 1 (the exporter exports it once the first XID is seen):
    the panel must show 1 for it, as GPUFatalXID pages for it. Evaluated by promtool."""
    from tests.alerts.promtool import run_promtool, selector

    [panel] = [p for p in panels(DOCS[uids.GPUS]) if p["title"] == "XID errors"]
    expr = panel["targets"][0]["expr"].replace("$__rate_interval", "4m").replace('=~"$host"', '=~".*"') \
        .replace('=~"$gpu"', '=~".*"').replace('=~"$cluster"', '=~".*"')
    series = selector("inferwatch_gpu_xid_errors_total", {"instance": "n1:9400", "gpu": "0", "xid": "79"})
    doc = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [{"series": series, "values": "_x5 1x20"}],
        "promql_expr_test": [
            {"expr": expr, "eval_time": "2m", "exp_samples": [{"labels": '{xid="none"}', "value": 0}]},
            {"expr": expr, "eval_time": "6m", "exp_samples": [{"labels": '{xid="79"}', "value": 1}]},
            {"expr": expr, "eval_time": "15m", "exp_samples": [{"labels": '{xid="79"}', "value": 0}]}]}]}
    result = run_promtool(doc, tmp_path, clustered=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_p_values_are_on_a_log_axis():
    shown = [p for p in panels(DOCS[uids.DRIFT]) if "p-value" in p["title"]]
    assert len(shown) == 4  # numeric, answer and sampling features, the A/B sample ratio
    for panel in shown:
        assert panel["fieldConfig"]["defaults"]["custom"]["scaleDistribution"] == {"type": "log", "log": 10}, \
            panel["title"]


def test_every_alert_links_to_a_dashboard_that_shows_what_it_reads():
    """An alert's dashboard_url must lead to its signal: some panel reads a metric its
    expression reads (the A/B, NVML and upstream alerts once led to none)."""
    for alert in DEFAULT.alerts:
        if not alert.dashboard:
            continue
        shown = {name for p in panels(DOCS[alert.dashboard]) for t in p["targets"] for name in metric_names(t["expr"])}
        read = metric_names(alert.expr) - {"ALERTS", "ALERTS_FOR_STATE"}
        assert read & shown, (alert.name, sorted(read))


@pytest.mark.parametrize("uid", [uids.SERVING, uids.GPUS, uids.DRIFT])
def test_each_dashboard_opens_with_its_health(uid):
    """Targets up and the alerts of this dashboard's scope, above everything else."""
    doc = DOCS[uid]
    assert doc["panels"][0]["type"] == "row" and doc["panels"][0]["title"] == "Health"
    second_row = next(i for i, p in enumerate(doc["panels"][1:], 1) if p["type"] == "row")
    titles = {p["title"] for p in doc["panels"][1:second_row]}
    assert {"Targets up", "Alerts firing here"} <= titles, titles
    [firing] = [p for p in doc["panels"] if p["title"] == "Alerts firing here"]
    linked = {a.name for a in DEFAULT.alerts if a.dashboard == uid}
    assert set(re.search(r'alertname=~"([^"]+)"', firing["targets"][0]["expr"])[1].split("|")) == linked


def test_every_query_parses(tmp_path):
    """Each panel query, with variables and macros substituted as Grafana would, is PromQL
    that promtool accepts (each as a recording rule's expression)."""
    import subprocess

    import yaml

    from inferwatch.dashboards.queries import TimeRange, substitute

    tr = TimeRange(0, 3600, 15)
    rules = []
    for doc in DOCS.values():
        variables = {v["name"]: ".*" for v in doc["templating"]["list"]}
        rules += [{"record": f"check:{doc['uid'].replace('-', '_')}:{i}", "expr": substitute(expr, variables, tr)}
                  for i, expr in enumerate(exprs(doc))]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_latency_is_per_model_and_the_model_layer_is_shown():
    """With "All" models a slow model must not be averaged away: the quantiles are grouped
    by model; prompt and generation lengths, finish reasons, prefill and decode are there."""
    serving = {p["title"]: p for p in panels(DOCS[uids.SERVING])}
    for title in ("Request latency", "Time to first token", "Inter-token latency", "Time per output token"):
        assert all(re.search(r"sum by \(le, model\)", t["expr"]) and "{{model}}" in t["legendFormat"]
                   for t in serving[title]["targets"]), title
    assert {"Prompt length", "Generation length", "Finish reasons", "Prefill and decode time (p95)"} <= set(serving)
    assert "finished_reason" in serving["Finish reasons"]["targets"][0]["expr"]


def test_every_gpu_reading_is_on_the_gpu_dashboard_or_left_out_with_its_reason():
    from inferwatch.alerts.catalog import series_of
    from inferwatch.dashboards.gpus import NOT_ON_DASHBOARDS
    from inferwatch.exporters.metrics import SPECS

    shown = {name for p in panels(DOCS[uids.GPUS]) for t in p["targets"] for name in metric_names(t["expr"])}
    missing = [s.name for s in SPECS if not set(series_of(s.name, s.kind)) & shown and s.name not in NOT_ON_DASHBOARDS]
    assert missing == [], f"exporter readings on no GPU panel and not in NOT_ON_DASHBOARDS: {missing}"
    both = [name for name in NOT_ON_DASHBOARDS if any(n in shown for n in (name, f"{name}_total"))]
    assert both == [], f"listed as left out but shown: {both}"
    assert set(NOT_ON_DASHBOARDS) <= {s.name for s in SPECS}, "a left-out name the exporter does not export"


def test_output_quality_shows_every_sampling_parameter_within_the_series_limit():
    """Each parameter the gateway bins is on a panel: by bin (each bin a series: at most 8,
    the live test's limit) or as the share of requests that set it."""
    from inferwatch.drift.sampling_params import PARAMS, VALUES

    serving = {p["title"]: p for p in panels(DOCS[uids.SERVING])}
    by_bin = [t for t in serving if t.startswith("Sampling: ") and "," not in t]
    shown = {t.removeprefix("Sampling: ") for t in by_bin}
    [flags] = [serving[t] for t in serving if t.startswith("Sampling: ") and "," in t]
    flagged = {re.search(r'param="(\w+)", value=~', t["expr"])[1] for t in flags["targets"]}
    assert shown | flagged == set(PARAMS) and not shown & flagged
    assert all(len(VALUES[param]) <= 8 for param in shown)
    assert {"Repetition in answers", "Answers empty, one token or looping"} <= set(serving)


def test_the_cost_row_reads_the_cost_rules_only():
    from inferwatch.alerts import cost

    records = {r.name for r in cost.records()}
    doc = DOCS[uids.SERVING]
    start = next(i for i, p in enumerate(doc["panels"]) if p["type"] == "row" and p["title"].startswith("Cost"))
    end = next(i for i, p in enumerate(doc["panels"][start + 1:], start + 1) if p["type"] == "row")
    read = {n for p in doc["panels"][start + 1:end] for t in p["targets"] for n in metric_names(t["expr"])}
    assert read and read <= records, read - records
    assert cost.TOKENS_PER_GPU_SECOND in read


def test_output_quality_panels_are_shares_of_requests(tmp_path):
    """Gateway-shaped counters through the panels' own queries, substituted as Grafana would,
    in promtool: bins as shares, a parameter nobody sets at 0, abnormal answers as a share of
    the 2xx answers."""
    from inferwatch.dashboards.queries import TimeRange, substitute
    from tests.alerts.promtool import run_promtool, selector

    serving = {p["title"]: p for p in panels(DOCS[uids.SERVING])}
    variables = {v["name"]: ".*" for v in DOCS[uids.SERVING]["templating"]["list"]}

    def expr(title: str, target: int = 0) -> str:
        return substitute(serving[title]["targets"][target]["expr"], variables, TimeRange(0, 3600, 60))

    gw = {"job": "inferwatch-gateway", "instance": "gw:8080", "model": "m1", "variant": "v1"}

    def sampled(param: str, value: str) -> str:
        return selector("inferwatch_gateway_sampling_requests_total", {**gw, "param": param, "value": value})

    series = {sampled("temperature", "default"): "0+30x20", sampled("temperature", "0"): "0+90x20",
              sampled("stream", "true"): "0+60x20", sampled("stream", "false"): "0+60x20",
              sampled("tools", "false"): "0+120x20", sampled("response_format", "none"): "0+120x20",
              sampled("n", "1"): "0+120x20",
              selector("inferwatch_gateway_requests_total", {**gw, "route": "/v1/chat/completions",
                                                             "status_class": "2xx"}): "0+120x20",
              selector("inferwatch_gateway_abnormal_outputs_total", {**gw, "route": "/v1/chat/completions",
                                                                     "kind": "loop"}): "0+12x20"}
    flags = [t["legendFormat"] for t in serving["Sampling: stream, tools, JSON, n"]["targets"]]

    def at_10m(query: str, samples: dict[str, float]) -> dict:
        return {"expr": query, "eval_time": "10m",
                "exp_samples": [{"labels": labels, "value": v} for labels, v in samples.items()]}

    checks = [at_10m(expr("Sampling: temperature"), {'{value="default"}': 0.25, '{value="0"}': 0.75}),
              *(at_10m(expr("Sampling: stream, tools, JSON, n", i), {"{}": 0.5 if legend == "streamed" else 0})
                for i, legend in enumerate(flags)),
              at_10m(expr("Answers empty, one token or looping"), {'{model="m1", kind="loop"}': 0.1})]
    doc = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "promql_expr_test": checks}]}
    result = run_promtool(doc, tmp_path, clustered=False)
    assert result.returncode == 0, result.stdout + result.stderr
