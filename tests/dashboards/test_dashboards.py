"""The generated dashboards: well-formed, reading only exported metrics correctly (that the
committed JSON is current is tests/inferwatch/test_generate.py's golden test)."""

from __future__ import annotations

import json
import re

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dash

from inferwatch.alerts.generate import rule_files
from inferwatch.alerts.spec import ALERTS
from inferwatch.dashboards import uids
from inferwatch.dashboards.generate import dashboards
from inferwatch.catalog import exposed, kind_of
from tests.support.promql import metric_names, range_functions

DOCS = dashboards()
RECORDED = {r["record"] for doc in rule_files().values() for g in doc["groups"] for r in g["rules"] if "record" in r}


def panels(doc: dict) -> list[dict]:
    return [p for p in doc["panels"] if p["type"] != "row"]


def exprs(doc: dict) -> list[str]:
    return [t["expr"] for p in panels(doc) for t in p["targets"]]


def test_uids_are_the_ones_alerts_link_to():
    assert set(DOCS) == {uids.SERVING, uids.GPUS, uids.DRIFT, uids.SLOS}
    linked = {a.dashboard for a in ALERTS if a.dashboard}
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
