"""GET/POST /v1/ab/{model}: verdicts for Argo Rollouts and Flagger from the gateway's records
alone (no weights, no start), epochs, gauges, the report, bad input."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from inferwatch.alerts.catalog import exposed
from inferwatch.drift.service.app import DriftSettings, create_app
from tests.support import ab_simulation as sim
from tests.support.feature_records import body, records
from tests.support.servers import metric_sum

ARMS = {"control": "control", "treatment": "treatment"}
M = sim.MODEL


@pytest.fixture(scope="module")
def client():
    """Epoch 4 at 10 % (a canary 40 % slower to its first token), then epoch 5 at 50 %."""
    now = time.time()
    rng = np.random.default_rng(1)
    users = sim.users(3000, 4, 1.0, rng)
    app = create_app(DriftSettings(db_path=":memory:"), CollectorRegistry())
    with TestClient(app) as c:
        for epoch, weights, t0 in ((4, (0.9, 0.1), now - 3000), (5, (0.5, 0.5), now - 1500)):
            r = sim.requests(users, sim.split(weights, epoch), t0, t0 + 1400, rng, effect=0.4)
            for b in sim.bodies(sim.feature_records(r), 3000):
                assert c.post("/v1/ingest", content=b).status_code == 200
        yield c


def test_get_judges_the_latest_epoch_from_records_alone_for_argo(client):
    r = client.get(f"/v1/ab/{M}", params=ARMS)
    assert r.status_code == 200
    doc = r.json()
    assert doc["experiment"] == sim.EXPERIMENT and doc["epoch"] == 5
    assert doc["weights"] == {"control": 0.5, "treatment": 0.5}
    assert doc["decision"] == "rollback" and doc["worse"] == ["ttft", "ttft_per_request"], doc["reasons"]
    assert doc["srm"]["unit"] == "units" and not doc["srm"]["alarm"]
    assert doc["units"]["control"] < doc["requests"]["control"]  # users send several requests each
    ttft = doc["metrics"]["ttft"]
    assert ttft["direction"] == "higher_is_worse" and ttft["test"] == "mann_whitney_units"
    assert ttft["relative"] > 0.2 and ttft["interval"]["low"] > 0
    assert doc["metrics"]["mean_logprob"]["status"] == "not_applicable"
    assert doc["alpha"] == pytest.approx(0.05 / 4) and doc["epochs"][0]["ordinal"] == 2  # the second epoch judged


def test_an_earlier_epoch_by_number_and_the_whole_experiment(client):
    first = client.get(f"/v1/ab/{M}", params={**ARMS, "epoch": 4}).json()
    assert first["epoch"] == 4 and first["weights"] == {"control": 0.9, "treatment": 0.1}
    assert first["alpha"] == pytest.approx(0.05 / 2)
    whole = client.get(f"/v1/ab/{M}", params={**ARMS, "scope": "experiment"}).json()
    assert [e["epoch"] for e in whole["epochs"]] == [4, 5] and whole["epoch"] == 5
    assert whole["decision"] == "rollback" and whole["worse"] == ["ttft", "ttft_per_request"]
    assert [e["decision"] for e in whole["epochs"]] == [first["decision"], "rollback"]


def test_flagger_webhook_fails_on_rollback_only(client):
    payload = {"name": "podinfo", "namespace": "test", "phase": "Progressing", "checksum": "abc",
               "metadata": ARMS | {"pass_on": "continue,promote,hold"}}
    r = client.post(f"/v1/ab/{M}", json=payload)
    assert r.status_code == 412 and r.json()["decision"] == "rollback"
    r = client.post(f"/v1/ab/{M}?pass_on=rollback", json=payload | {"metadata": ARMS})
    assert r.status_code == 200


def test_flagger_pass_on_with_spaces_is_read(client):
    payload = {"name": "podinfo", "namespace": "test", "phase": "Progressing", "checksum": "abc",
               "metadata": ARMS | {"pass_on": "continue, promote, rollback", "min_units": "50"}}
    r = client.post(f"/v1/ab/{M}", json=payload)
    assert r.status_code == 200 and r.json()["decision"] == "rollback"


def test_gauges_follow_the_last_experiment_asked_and_the_catalog_knows_them(client):
    client.get(f"/v1/ab/{M}", params=ARMS)
    text = client.get("/metrics").text
    key = f'control="control",model="{M}",treatment="treatment"'
    assert f'inferwatch_ab_decision{{control="control",decision="rollback",model="{M}",treatment="treatment"}} 1.0' \
        in text
    assert f'inferwatch_ab_guardrail_worse{{control="control",metric="ttft",model="{M}",treatment="treatment"}} 1.0' \
        in text
    assert f"inferwatch_ab_epoch{{{key}}} 5.0" in text
    # the effect sits inside its interval, as the JSON verdict gives them
    ttft = client.get(f"/v1/ab/{M}", params=ARMS).json()["metrics"]["ttft"]
    gauge = {bound: metric_sum(text, "inferwatch_ab_effect_relative_bound", metric="ttft", bound=bound)
             for bound in ("low", "high")}
    assert gauge == pytest.approx(ttft["relative_interval"])  # {"low": ..., "high": ...}
    assert gauge["low"] <= metric_sum(text, "inferwatch_ab_effect_relative", metric="ttft") <= gauge["high"]
    for line in text.splitlines():
        if line.startswith("inferwatch_ab"):
            assert line.split("{")[0].split(" ")[0] in exposed()


@pytest.mark.parametrize("arm", ["treatment", "control"])
def test_an_arm_without_records_is_a_200_hold_for_no_traffic(client, arm):
    """A canary at weight 0 (before the ramp, or rolled back) has no records: that is "no
    traffic", an answer Argo and Flagger can act on, not an error."""
    r = client.get(f"/v1/ab/{M}", params={**ARMS, arm: "v9"})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["decision"] == "hold" and doc["no_traffic"] == ["v9"] and doc["requests"][arm] == 0
    assert any("no traffic on v9" in reason for reason in doc["reasons"])
    assert any("control, treatment" in reason for reason in doc["reasons"])  # a typo in the name shows
    flagger = client.post(f"/v1/ab/{M}?pass_on=rollback", json={**ARMS, arm: "v9"})
    assert flagger.status_code == 412 and flagger.json()["decision"] == "hold"


@pytest.mark.parametrize("params, status, field", [
    ({**ARMS, "treatment": "control"}, 400, "treatment"),
    ({**ARMS, "epoch": -1}, 400, "epoch"),
    ({**ARMS, "epoch": "x"}, 400, "epoch"),
    ({**ARMS, "epoch": 9}, 404, "epoch"),
    ({**ARMS, "epoch": 5, "scope": "experiment"}, 400, "epoch"),
    ({**ARMS, "scope": "life"}, 400, "scope"),
    ({**ARMS, "experiment": "other"}, 404, "experiment"),
    ({**ARMS, "alpha": 0.9}, 400, "alpha"),
    ({**ARMS, "min_units": 50, "promote_units": 20}, 400, "promote_units"),
    ({**ARMS, "control_weight": 0.5}, 400, "control_weight"),
    ({**ARMS, "pass_on": "maybe"}, 400, "pass_on.0"),
    ({"treatment": "treatment"}, 400, "control"),
])
def test_bad_query_is_a_4xx_naming_the_field(client, params, status, field):
    r = client.get(f"/v1/ab/{M}", params=params)
    assert r.status_code == status, r.text
    assert r.json()["error"]["field"] == field


@pytest.mark.parametrize("doc, field", [
    ({**ARMS, "treatment": "control"}, "treatment"),
    ({**ARMS, "bogus": 1}, "bogus"),
    ({**ARMS, "epoch": "5"}, "epoch"),
    ([1, 2], "body"),
])
def test_bad_body_is_a_422_naming_the_field(client, doc, field):
    r = client.post(f"/v1/ab/{M}", json=doc)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field


def test_a_model_without_experiment_records_is_a_404_naming_it(client):
    r = client.get("/v1/ab/nope", params=ARMS)
    assert r.status_code == 404 and r.json()["error"]["field"] == "model"
    now = time.time()
    assert client.post("/v1/ingest", content=body(records(50, now - 60, now - 1, seed=1, model="plain"))
                       ).status_code == 200
    plain = client.get("/v1/ab/plain", params=ARMS).json()  # records without an experiment
    assert plain["error"]["field"] == "model" and "experiment, epoch and weight" in plain["error"]["message"]


def test_openapi_lists_the_route_with_its_models(client):
    doc = client.get("/openapi.json").json()
    ops = doc["paths"]["/v1/ab/{model}"]
    assert {"get", "post"} <= set(ops)
    names = {p["name"] for p in ops["get"]["parameters"]}
    assert {"control", "treatment", "experiment", "epoch", "scope", "pass_on"} <= names
    assert not names & {"control_weight", "treatment_weight", "since"}
    assert "AbResponse" in doc["components"]["schemas"]


def test_report_shows_the_watched_experiment_with_plots(client):
    client.get(f"/v1/ab/{M}", params=ARMS)
    page = client.get("/report", params={"model": M}).text
    assert f"A/B {M}, experiment {sim.EXPERIMENT} epoch 5: control (control) vs treatment (treatment)" in page
    assert "ROLLBACK" in page and "treatment worse on ttft" in page
    assert page.count("<polyline") >= 8  # two arms' distribution functions per latency and length metric


def test_units_at_a_weight_of_zero_are_a_sample_ratio_hold_not_an_error():
    now = time.time()
    rng = np.random.default_rng(8)
    r = sim.requests(sim.users(200, 2, 1.0, rng), sim.split((0.5, 0.5), 0), now - 600, now - 1, rng)
    recs = [x | {"weight": 1.0 if x["variant"] == "control" else 0.0} for x in sim.feature_records(r)]
    app = create_app(DriftSettings(db_path=":memory:"), CollectorRegistry())
    with TestClient(app) as c:
        assert c.post("/v1/ingest", content=sim.bodies(recs)[0]).status_code == 200
        reply = c.get(f"/v1/ab/{M}", params=ARMS)
        doc = reply.json()
        assert reply.status_code == 200 and doc["decision"] == "hold" and doc["srm"]["alarm"]
        assert doc["srm"]["chi2"] is None and "treatment has weight 0" in doc["reasons"][0]
        assert "MISMATCH" in c.get("/report", params={"model": M}).text


def test_other_experiments_of_the_model_are_named_and_the_latest_is_judged():
    now = time.time()
    rng = np.random.default_rng(9)
    r = sim.requests(sim.users(200, 2, 1.0, rng), sim.split((0.5, 0.5), 0), now - 600, now - 60, rng)
    recs = sim.feature_records(r)
    stray = recs[0] | {"experiment": "stray", "finished_at": now - 1, "started_at": now - 2}
    app = create_app(DriftSettings(db_path=":memory:"), CollectorRegistry())
    with TestClient(app) as c:
        assert c.post("/v1/ingest", content=sim.bodies([*recs, stray])[0]).status_code == 200
        doc = c.get(f"/v1/ab/{M}", params=ARMS).json()
        assert doc["experiment"] == "stray" and doc["experiments"] == ["stray", sim.EXPERIMENT]
        assert any(f"other experiments of model '{M}': {sim.EXPERIMENT}" in x for x in doc["reasons"])
        chosen = c.get(f"/v1/ab/{M}", params={**ARMS, "experiment": sim.EXPERIMENT}).json()
        assert chosen["experiment"] == sim.EXPERIMENT and not any("other experiments" in x for x in chosen["reasons"])


def test_a_lead_in_epoch_adjusts_the_rank_tests_and_is_named():
    """The canary at weight 0 first (every user on the control), then 50/50: the verdict names
    the lead-in and its rank tests say they were adjusted; the earlier client's experiment,
    without one, says none."""
    now = time.time()
    rng = np.random.default_rng(2)
    users = sim.users(600, 4, 1.0, rng)
    with TestClient(create_app(DriftSettings(db_path=":memory:"), CollectorRegistry())) as c:
        for epoch, weights, t0 in ((0, (1.0, 0.0), now - 3000), (1, (0.5, 0.5), now - 1500)):
            r = sim.requests(users, sim.split(weights, epoch), t0, t0 + 1400, rng)
            for b in sim.bodies(sim.feature_records(r), 3000):
                assert c.post("/v1/ingest", content=b).status_code == 200
        doc = c.get(f"/v1/ab/{M}", params=ARMS).json()
    assert doc["epoch"] == 1 and doc["lead_in_epoch"] == 0
    assert "CUPED" in doc["metrics"]["ttft"]["note"] and "CUPED" not in doc["metrics"]["ttft_per_request"]["note"]
    assert doc["srm"]["promote_p"] == 0.1 and {"alarm_fixed", "alarm_sequential"} <= doc["srm"].keys()


def test_without_a_lead_in_nothing_is_adjusted(client):
    doc = client.get(f"/v1/ab/{M}", params=ARMS).json()
    assert doc["lead_in_epoch"] is None and "CUPED" not in doc["metrics"]["ttft"]["note"]
