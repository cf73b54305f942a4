"""Feedback from the gateway: POST /v1/feedback, each rating joined to its answer's unit and
epoch in the experiment ledger (the A/B feedback guardrail), stored, and bad ratings refused;
the feature records' experiment fields checked."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from inferwatch.drift.service.app import DriftSettings, create_app
from tests.support import ab_simulation as sim
from tests.support.feature_records import records

ARMS = {"control": "control", "treatment": "treatment"}


def ratings(r: sim.Requests, arm: int, positive_share: float, at: float, rng: np.random.Generator) -> list[dict]:
    """A rating of every answer of ``arm``'s first 600 requests, as the gateway forwards it."""
    rows = np.flatnonzero(r.arm == arm)[:600]
    return [{"model": sim.MODEL, "variant": ("control", "treatment")[arm], "experiment": sim.EXPERIMENT,
             "epoch": r.epoch, "unit": r.unit[i], "score": float(rng.random() < positive_share), "at": at}
            for i in rows]


@pytest.fixture
def client(tmp_path):
    app = create_app(DriftSettings(db_path=str(tmp_path / "d.sqlite3"), token="t"), CollectorRegistry())
    with TestClient(app, headers={"authorization": "Bearer t"}) as c:
        yield c


def test_ratings_join_their_units_and_become_the_feedback_guardrail_kept_across_a_restart(tmp_path, client):
    now = time.time()
    rng = np.random.default_rng(2)
    r = sim.requests(sim.users(800, 3, 1.0, rng), sim.split((0.5, 0.5), 0), now - 900, now - 10, rng)
    for b in sim.bodies(sim.feature_records(r)):
        assert client.post("/v1/ingest", content=b).status_code == 200
    given = ratings(r, 0, 0.8, now - 5, rng) + ratings(r, 1, 0.5, now - 5, rng)
    reply = client.post("/v1/feedback", json={"records": given})
    assert reply.status_code == 200 and reply.json() == {"accepted": len(given), "duplicates": 0}
    doc = client.get(f"/v1/ab/{sim.MODEL}", params=ARMS).json()
    feedback = doc["metrics"]["feedback"]
    rated_units = [len({g["unit"] for g in given if g["variant"] == v}) for v in ("control", "treatment")]
    assert feedback["n"] == dict(zip(("control", "treatment"), rated_units))  # units, not ratings
    assert feedback["test"] == "delta_method" and feedback["verdict"] == "worse" and doc["worse"] == ["feedback"]
    client.__exit__(None, None, None)  # the service stops; ratings were stored as they came
    app = create_app(DriftSettings(db_path=str(tmp_path / "d.sqlite3"), token="t"), CollectorRegistry())
    with TestClient(app, headers={"authorization": "Bearer t"}) as again:
        assert again.get(f"/v1/ab/{sim.MODEL}", params=ARMS).json()["metrics"]["feedback"] == feedback


def test_a_rating_of_an_answer_no_experiment_assigned_joins_nothing(client):
    rating = {"model": "m", "variant": "v1", "score": 1.0, "at": time.time()}
    assert client.post("/v1/feedback", json={"records": [rating]}).json() == {"accepted": 0, "duplicates": 0}


@pytest.mark.parametrize("record, field", [
    ({"variant": "v1", "score": 1, "at": 1e9}, "records.0.model"),
    ({"model": "m", "variant": "v1", "score": 1.5, "at": 1e9}, "records.0.score"),
    ({"model": "m", "variant": "v1", "score": 1, "at": 1e9, "text": "great"}, "records.0.text"),
    ({"model": "m", "variant": "v1", "score": 1, "at": False}, "records.0.at"),  # the schema asks for a number
    ({"model": "m", "variant": "v1", "score": "1", "at": 1e9}, "records.0.score"),
    ({"model": "m", "variant": "v1", "score": 1, "at": 1e9, "epoch": -1}, "records.0.epoch"),
])
def test_bad_ratings_are_a_422_naming_the_field(client, record, field):
    r = client.post("/v1/feedback", json={"records": [record]})
    assert r.status_code == 422 and r.json()["error"]["field"] == field


def test_ratings_need_the_token(client):
    r = client.post("/v1/feedback", json={"records": [{"model": "m", "variant": "v1", "score": 1.0,
                                                       "at": time.time()}]}, headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401


def test_a_record_with_a_bad_experiment_is_refused_naming_it(client):
    rec = records(1, time.time() - 10, time.time() - 1, seed=1, variant="v1")[0] | {"experiment": 7}
    r = client.post("/v1/ingest", content=orjson.dumps({"records": [rec]}))
    assert r.status_code == 422 and r.json()["error"]["field"] == "experiment"


@pytest.mark.parametrize("fields, field", [
    ({"experiment": "e", "epoch": 1}, "weight"),
    ({"experiment": "e", "weight": 0.5}, "epoch"),
    ({"epoch": 1, "weight": 0.5}, "experiment"),
    ({"experiment": "e", "epoch": 1, "weight": 1.5}, "weight"),
    ({"experiment": "e", "epoch": -2, "weight": 0.5}, "epoch"),
])
def test_a_record_with_half_an_assignment_is_refused_naming_what_is_missing(client, fields, field):
    rec = records(1, time.time() - 10, time.time() - 1, seed=1, variant="v1")[0] | fields
    r = client.post("/v1/ingest", content=orjson.dumps({"records": [rec]}))
    assert r.status_code == 422 and r.json()["error"]["field"] == field


def test_ratings_never_start_an_experiment_nor_move_the_judged_epoch(client):
    """A rating joins an experiment that has records; its epoch counts only once that epoch
    has records: a stray epoch, an unknown experiment or model, or a variant without
    records changes no verdict."""
    now = time.time()
    rng = np.random.default_rng(3)
    r = sim.requests(sim.users(300, 3, 1.0, rng), sim.split((0.5, 0.5), 2), now - 900, now - 10, rng)
    for b in sim.bodies(sim.feature_records(r)):
        assert client.post("/v1/ingest", content=b).status_code == 200
    before = client.get(f"/v1/ab/{sim.MODEL}", params=ARMS).json()
    base = {"model": sim.MODEL, "variant": "treatment", "experiment": sim.EXPERIMENT, "epoch": 2, "unit": r.unit[0],
            "score": 1.0, "at": now}
    strays = [base | {"epoch": 77}, base | {"experiment": "nope"}, base | {"model": "other"}, base | {"variant": "v9"}]
    # the last two join none
    assert client.post("/v1/feedback", json={"records": strays}).json() == {"accepted": 2, "duplicates": 0}
    assert client.get(f"/v1/ab/{sim.MODEL}", params=ARMS).json() == before
    assert client.get(f"/v1/ab/{sim.MODEL}", params={**ARMS, "epoch": 77}).status_code == 404
    assert client.get("/v1/ab/other", params=ARMS).status_code == 404
    assert client.get(f"/v1/ab/{sim.MODEL}", params={**ARMS, "experiment": "nope"}).status_code == 404
    bad = client.post("/v1/feedback", json={"records": [base | {"experiment": None}]})
    assert bad.status_code == 422 and "experiment" in bad.json()["error"]["message"]


def test_a_rating_that_comes_before_its_record_joins_the_same_unit(client):
    """The gateway forwards a rating at once and the answer's record in a batch."""
    now = time.time()
    rng = np.random.default_rng(4)
    r = sim.requests(sim.users(200, 2, 1.0, rng), sim.split((0.5, 0.5), 0), now - 900, now - 10, rng)
    recs = sim.feature_records(r)
    late = [x for x in recs if x["unit"] == recs[-1]["unit"]]
    early = [x for x in recs if x["unit"] != recs[-1]["unit"]]
    assert client.post("/v1/ingest", content=sim.bodies(early)[0]).status_code == 200
    rating = {"model": sim.MODEL, "variant": late[0]["variant"], "experiment": sim.EXPERIMENT, "epoch": 0,
              "unit": late[0]["unit"], "score": 1.0, "at": now}
    assert client.post("/v1/feedback", json={"records": [rating]}).json() == {"accepted": 1, "duplicates": 0}
    assert client.post("/v1/ingest", content=sim.bodies(late)[0]).status_code == 200
    doc = client.get(f"/v1/ab/{sim.MODEL}", params=ARMS).json()
    arm = "control" if late[0]["variant"] == "control" else "treatment"
    assert doc["metrics"]["feedback"]["n"][arm] == 1  # one unit rated, the one that then sent its record
    assert sum(doc["units"].values()) == len({x["unit"] for x in recs})


def test_an_answer_rated_twice_counts_once_across_a_restart(tmp_path, client):
    """Each answer counts once, whichever way a second rating came (a try whose answer was
    lost and was sent again, a gateway whose memory of the rating was lost)."""
    now = time.time()
    rng = np.random.default_rng(5)
    r = sim.requests(sim.users(200, 2, 1.0, rng), sim.split((0.5, 0.5), 0), now - 900, now - 10, rng)
    for b in sim.bodies(sim.feature_records(r)):
        assert client.post("/v1/ingest", content=b).status_code == 200
    given = [dict(g, response_id=f"cmpl-{i}") for i, g in enumerate(ratings(r, 0, 0.8, now - 5, rng)[:20])]
    assert client.post("/v1/feedback", json={"records": given}).json() == {"accepted": 20, "duplicates": 0}
    n = client.get(f"/v1/ab/{sim.MODEL}", params=ARMS).json()["metrics"]["feedback"]["n"]
    again = [dict(g, score=1.0 - g["score"]) for g in given[:5]] + [dict(given[0], response_id="cmpl-new")]
    assert client.post("/v1/feedback", json={"records": again}).json() == {"accepted": 1, "duplicates": 5}
    client.__exit__(None, None, None)
    app = create_app(DriftSettings(db_path=str(tmp_path / "d.sqlite3"), token="t"), CollectorRegistry())
    with TestClient(app, headers={"authorization": "Bearer t"}) as restarted:
        assert restarted.post("/v1/feedback", json={"records": given[5:7]}).json() == {"accepted": 0, "duplicates": 2}
        doc = restarted.get(f"/v1/ab/{sim.MODEL}", params=ARMS).json()["metrics"]["feedback"]["n"]
    assert doc == n  # the new answer's rating joined a unit rated already: units, not ratings


def test_a_batch_sent_again_under_its_idempotency_key_is_stored_once(tmp_path, client):
    now = time.time()
    rng = np.random.default_rng(6)
    r = sim.requests(sim.users(100, 2, 1.0, rng), sim.split((0.5, 0.5), 0), now - 900, now - 10, rng)
    first = sim.bodies(sim.feature_records(r))[0]
    sent = client.post("/v1/ingest", content=first, headers={"idempotency-key": "batch-1"}).json()
    assert sent["accepted"] > 0 and not sent.get("duplicate")
    assert client.post("/v1/ingest", content=first, headers={"idempotency-key": "batch-1"}).json() == \
        {"accepted": 0, "in_window": 0, "duplicate": True}
    assert client.post("/v1/ingest", content=first).json()["accepted"] == sent["accepted"]  # no key: stored again
    assert client.post("/v1/ingest", content=first, headers={"idempotency-key": ""}).status_code == 422
    metrics = client.get("/metrics").text
    assert 'inferwatch_drift_rejected_batches_total{reason="duplicate"} 1.0' in metrics
    client.__exit__(None, None, None)
    app = create_app(DriftSettings(db_path=str(tmp_path / "d.sqlite3"), token="t"), CollectorRegistry())
    with TestClient(app, headers={"authorization": "Bearer t"}) as restarted:
        assert restarted.post("/v1/ingest", content=first, headers={"idempotency-key": "batch-1"}).json()[
            "duplicate"] is True
        assert restarted.post("/v1/ingest", content=first, headers={"idempotency-key": "batch-2"}).json()[
            "accepted"] == sent["accepted"]
