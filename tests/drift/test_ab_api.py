"""GET/POST /v1/ab/{model}: verdicts for Argo Rollouts and Flagger, gauges, bad input."""

from __future__ import annotations

import time

import orjson
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from inferwatch.catalog import exposed
from inferwatch.drift.service import DriftSettings, create_app
from tests.support.feature_records import records

SPLIT = {"control": "v1", "treatment": "v2", "control_weight": 0.5, "treatment_weight": 0.5}


@pytest.fixture(scope="module")
def client():
    now = time.time()
    app = create_app(DriftSettings(db_path=":memory:"), CollectorRegistry())
    with TestClient(app) as c:
        recs = (records(600, now - 600, now - 1, seed=1, variant="v1")
                + records(600, now - 600, now - 1, seed=2, variant="v2", ttft_scale=0.15))
        for i in range(0, len(recs), 600):
            assert c.post("/v1/ingest", content=orjson.dumps({"records": recs[i:i + 600]})).status_code == 200
        yield c


def test_get_names_the_slower_variant_for_argo(client):
    r = client.get("/v1/ab/m", params=SPLIT)
    assert r.status_code == 200
    body = r.json()
    assert body["decision"] == "rollback" and body["worse"] == ["ttft"]
    assert body["requests"] == {"control": 600, "treatment": 600}
    assert body["srm"]["source"] == "records" and not body["srm"]["alarm"]
    ttft = body["metrics"]["ttft"]
    assert ttft["direction"] == "higher_is_worse" and ttft["test"] == "mann_whitney"
    assert ttft["relative"] > 0.2 and ttft["interval"]["low"] > 0
    assert body["metrics"]["mean_logprob"]["status"] == "not_applicable"


def test_assignments_and_feedback_are_inputs(client):
    r = client.post("/v1/ab/m", json={**SPLIT, "control_assignments": 700, "treatment_assignments": 300,
                                      "control_feedback_positive": 70, "control_feedback_total": 100,
                                      "treatment_feedback_positive": 40, "treatment_feedback_total": 100,
                                      "shared_tokenizer": True})
    body = r.json()
    assert r.status_code == 200 and body["srm"]["source"] == "assignments" and body["srm"]["alarm"]
    assert body["decision"] == "hold"
    assert body["metrics"]["feedback"]["status"] == "ok" and body["metrics"]["mean_logprob"]["test"] == "welch"


def test_flagger_webhook_fails_on_rollback_only(client):
    payload = {"name": "podinfo", "namespace": "test", "phase": "Progressing", "checksum": "abc",
               "metadata": {k: str(v) for k, v in SPLIT.items()} | {"pass_on": "continue,promote,hold"}}
    r = client.post("/v1/ab/m", json=payload)
    assert r.status_code == 412 and r.json()["decision"] == "rollback"
    r = client.post("/v1/ab/m?pass_on=rollback", json=payload | {"metadata": {k: str(v) for k, v in SPLIT.items()}})
    assert r.status_code == 200


def test_flagger_pass_on_with_spaces_is_read(client):
    payload = {"name": "podinfo", "namespace": "test", "phase": "Progressing", "checksum": "abc",
               "metadata": {k: str(v) for k, v in SPLIT.items()} | {"pass_on": "continue, promote, rollback"}}
    r = client.post("/v1/ab/m", json=payload)
    assert r.status_code == 200 and r.json()["decision"] == "rollback"


def test_gauges_follow_the_last_experiment_asked_and_the_catalog_knows_them(client):
    client.get("/v1/ab/m", params=SPLIT)
    text = client.get("/metrics").text
    assert 'inferwatch_ab_decision{control="v1",decision="rollback",model="m",treatment="v2"} 1.0' in text
    assert 'inferwatch_ab_guardrail_worse{control="v1",metric="ttft",model="m",treatment="v2"} 1.0' in text
    for line in text.splitlines():
        if line.startswith("inferwatch_ab"):
            assert line.split("{")[0] in exposed()


@pytest.mark.parametrize("arm", ["treatment", "control"])
def test_an_arm_without_records_is_a_200_hold_for_no_traffic(client, arm):
    """A canary at weight 0 (before the ramp, or rolled back) has no records: that is "no
    traffic", an answer Argo and Flagger can act on, not an error."""
    r = client.get("/v1/ab/m", params={**SPLIT, arm: "v9"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["decision"] == "hold" and body["no_traffic"] == ["v9"] and body["requests"][arm] == 0
    assert any("no traffic on v9" in reason for reason in body["reasons"])
    assert any("v1, v2" in reason for reason in body["reasons"])  # a typo in the name shows
    flagger = client.post("/v1/ab/m?pass_on=rollback", json={**SPLIT, arm: "v9"})
    assert flagger.status_code == 412 and flagger.json()["decision"] == "hold"


@pytest.mark.parametrize("params, status, field", [
    ({**SPLIT, "treatment_weight": 0.6}, 400, "treatment_weight"),
    ({**SPLIT, "control_weight": "abc"}, 400, "control_weight"),
    ({**SPLIT, "control_weight": "nan"}, 400, "control_weight"),
    ({**SPLIT, "control_weight": 1.5}, 400, "control_weight"),
    ({**SPLIT, "treatment": "v1"}, 400, "treatment"),
    ({**SPLIT, "control_assignments": 5}, 400, "treatment_assignments"),
    ({**SPLIT, "control_assignments": -1, "treatment_assignments": 1}, 400, "control_assignments"),
    ({**SPLIT, "alpha": 0.9}, 400, "alpha"),
    ({**SPLIT, "pass_on": "maybe"}, 400, "pass_on.0"),
    ({k: v for k, v in SPLIT.items() if k != "control"}, 400, "control"),
])
def test_bad_query_is_a_4xx_naming_the_field(client, params, status, field):
    r = client.get("/v1/ab/m", params=params)
    assert r.status_code == status, r.text
    assert r.json()["error"]["field"] == field


@pytest.mark.parametrize("body, field", [
    ({**SPLIT, "treatment_weight": 0.7}, "treatment_weight"),
    ({**SPLIT, "bogus": 1}, "bogus"),
    ({**SPLIT, "control_feedback_positive": 9, "control_feedback_total": 5, "treatment_feedback_positive": 1,
      "treatment_feedback_total": 5}, "control_feedback_positive"),
    ([1, 2], "body"),
])
def test_bad_body_is_a_422_naming_the_field(client, body, field):
    r = client.post("/v1/ab/m", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field


def test_a_model_without_records_is_a_404_naming_it(client):
    r = client.get("/v1/ab/nope", params=SPLIT)
    assert r.status_code == 404 and r.json()["error"]["field"] == "model"


def test_openapi_lists_the_route_with_its_models(client):
    doc = client.get("/openapi.json").json()
    ops = doc["paths"]["/v1/ab/{model}"]
    assert {"get", "post"} <= set(ops)
    names = {p["name"] for p in ops["get"]["parameters"]}
    assert {"control", "treatment", "control_weight", "treatment_weight", "since", "pass_on"} <= names
    assert "AbResponse" in doc["components"]["schemas"]


def test_report_shows_the_watched_experiment_with_plots(client):
    client.get("/v1/ab/m", params=SPLIT)
    page = client.get("/report", params={"model": "m"}).text
    assert "A/B m: v1 (control) vs v2 (treatment)" in page and "ROLLBACK" in page
    assert page.count("<polyline") >= 8  # two arms' distribution functions per latency and length metric
    assert "treatment worse on ttft" in page


def test_since_counts_no_record_from_before_it_rounding_up_to_the_next_bucket():
    """After a ramp step, records of the old split in the bucket holding ``since`` would skew
    the sample-ratio check: ``since`` starts at the next bucket boundary (width 60 s here),
    so every record counted finished at or after it."""
    width = 60.0
    boundary = (time.time() // width - 3) * width  # a whole bucket boundary three buckets ago
    step = boundary - 30  # mid-bucket: the step happened half way through the bucket before
    app = create_app(DriftSettings(db_path=":memory:"), CollectorRegistry())
    with TestClient(app) as c:
        before = (records(200, step - 25, step - 1, seed=3, variant="v1")  # old split: all control
                  + records(10, step - 25, step - 1, seed=4, variant="v2"))
        after = (records(100, boundary + 1, boundary + 50, seed=5, variant="v1")
                 + records(100, boundary + 1, boundary + 50, seed=6, variant="v2"))
        for batch in (before, after):
            assert c.post("/v1/ingest", content=orjson.dumps({"records": batch})).status_code == 200
        body = c.get("/v1/ab/m", params={**SPLIT, "since": step}).json()
        assert body["requests"] == {"control": 100, "treatment": 100} and not body["srm"]["alarm"]
        assert body["since"] == step
        on_boundary = c.get("/v1/ab/m", params={**SPLIT, "since": boundary}).json()
        assert on_boundary["requests"] == {"control": 100, "treatment": 100}
