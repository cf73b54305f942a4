"""Feedback from the gateway: POST /v1/feedback, counted per variant by the A/B verdict, and
the feature records' experiment fields accepted."""

from __future__ import annotations

import time

import orjson
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from inferwatch.drift.feedback import FeedbackBatch, FeedbackLog
from inferwatch.drift.service import DriftSettings, create_app
from tests.support.clock import Clock
from tests.support.feature_records import records

SPLIT = {"control": "v1", "treatment": "v2", "control_weight": 0.5, "treatment_weight": 0.5}


def ratings(variant: str, positive: int, total: int, at: float) -> list[dict]:
    return [{"model": "m", "variant": variant, "experiment": "exp-1", "score": 1.0 if i < positive else 0.0, "at": at}
            for i in range(total)]


@pytest.fixture
def client():
    app = create_app(DriftSettings(db_path=":memory:", token="t"), CollectorRegistry())
    with TestClient(app, headers={"authorization": "Bearer t"}) as c:
        yield c


def test_ratings_become_the_feedback_guardrail(client):
    now = time.time()
    recs = records(300, now - 300, now - 1, seed=1, variant="v1") + records(300, now - 300, now - 1, seed=1,
                                                                            variant="v2")
    for rec in recs:
        rec.update(experiment="exp-1", unit="0123456789abcdef")  # the gateway's A/B fields are accepted
    assert client.post("/v1/ingest", content=orjson.dumps({"records": recs})).status_code == 200
    r = client.post("/v1/feedback", json={"records": ratings("v1", 160, 200, now - 5) + ratings("v2", 90, 200, now - 5)})
    assert r.status_code == 200 and r.json() == {"accepted": 400}
    body = client.get("/v1/ab/m", params=SPLIT).json()
    feedback = body["metrics"]["feedback"]
    assert feedback["n"] == {"control": 200, "treatment": 200} and feedback["verdict"] == "worse"
    assert body["worse"] == ["feedback"]
    given = client.get("/v1/ab/m", params={**SPLIT, "control_feedback_positive": 10, "control_feedback_total": 20,
                                           "treatment_feedback_positive": 10, "treatment_feedback_total": 20}).json()
    assert given["metrics"]["feedback"]["n"] == {"control": 20, "treatment": 20}  # the request's counts win


@pytest.mark.parametrize("record, field", [
    ({"variant": "v1", "score": 1, "at": 1e9}, "records.0.model"),
    ({"model": "m", "variant": "v1", "score": 1.5, "at": 1e9}, "records.0.score"),
    ({"model": "m", "variant": "v1", "score": 1, "at": 1e9, "text": "great"}, "records.0.text"),
    ({"model": "m", "variant": "v1", "score": 1, "at": False}, "records.0.at"),  # the schema asks for a number
    ({"model": "m", "variant": "v1", "score": "1", "at": 1e9}, "records.0.score"),
])
def test_bad_ratings_are_a_422_naming_the_field(client, record, field):
    r = client.post("/v1/feedback", json={"records": [record]})
    assert r.status_code == 422 and r.json()["error"]["field"] == field


def test_ratings_need_the_token(client):
    r = client.post("/v1/feedback", json={"records": ratings("v1", 1, 1, time.time())},
                    headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401


def test_a_record_with_a_bad_experiment_is_refused_naming_it(client):
    rec = records(1, time.time() - 10, time.time() - 1, seed=1, variant="v1")[0] | {"experiment": 7}
    r = client.post("/v1/ingest", content=orjson.dumps({"records": [rec]}))
    assert r.status_code == 422 and r.json()["error"]["field"] == "experiment"


def test_the_log_keeps_the_window_and_a_segment_bound():
    clock = Clock(1000.0)
    log = FeedbackLog(window_s=60, max_segments=1, clock=clock)
    batch = FeedbackBatch.model_validate({"records": ratings("v1", 2, 3, 950) + ratings("v2", 1, 1, 990)})
    assert log.add(batch) == 3  # v2 is beyond the bound
    assert log.counts("m", "v1") == (2, 3) and log.counts("m", "v2") == (0, 0)
    clock.now = 1020.0
    assert log.counts("m", "v1") == (0, 0)  # out of the window
    assert log.counts("m", "v1", since=900) == (0, 0)
