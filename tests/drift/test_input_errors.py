"""Bad input the reviewer found answered without naming what was wrong, or accepted: every
4xx below names the field to blame; the Allow header of a 405 lists every method the path
takes."""

from __future__ import annotations

import time

import pytest
import requests

from inferwatch.drift.service.app import DriftSettings, create_app
from tests.support.feature_records import records
from tests.support.servers import AppServer


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    settings = DriftSettings(db_path=str(tmp_path_factory.mktemp("inputs") / "drift.sqlite3"))
    with AppServer(create_app(settings)) as server:
        yield server


@pytest.mark.parametrize("path, takes", [("/v1/baselines", {"GET", "POST"}), ("/v1/thresholds", {"GET", "PUT"}),
                                          ("/v1/ab/m", {"GET", "POST"})])
def test_a_405_allows_every_method_of_the_path(service, path, takes):
    r = requests.options(service.url + path, timeout=10)
    assert r.status_code == 405
    assert {m.strip() for m in r.headers["allow"].split(",")} >= takes


def _record(**changes) -> dict:
    rec = records(1, time.time() - 10, time.time() - 5, seed=3)[0]
    rec.update(changes)
    return rec


@pytest.mark.parametrize("method, path, doc, field", [
    ("post", "/v1/ingest", {"records": None}, "records"),
    ("post", "/v1/ingest", {"records": []}, "records"),
    ("post", "/v1/ingest", "LIST", "records"),
    ("post", "/v1/ingest", "MANY", "records"),
    ("post", "/v1/ingest", "STARTED_AFTER", "started_at"),
    ("post", "/v1/ingest", "TTFT_AFTER_E2E", "ttft_s"),
    ("post", "/v1/baselines", {"model": "m", "variant": "v", "from": 1.0, "to": 2.0}, "from"),
    ("post", "/v1/baselines", {"model": "m", "variant": "v", "histograms": {}}, "histograms"),
    ("post", "/v1/baselines", {"model": "m", "variant": "v", "histogram": {"ttft_s": [1]}}, "histogram"),
    ("put", "/v1/thresholds", {}, "alpha"),
    ("get", "/v1/fleet-drift?metric=not-a-metric&reference_end=1", None, "metric"),
])
def test_every_4xx_names_the_field_to_blame(service, method, path, doc, field):
    if doc == "LIST":
        doc = []
    elif doc == "MANY":
        doc = {"records": [_record()] * 10_001}
    elif doc == "STARTED_AFTER":
        rec = _record()
        doc = {"records": [_record(), _record(started_at=rec["finished_at"] + 5)]}
    elif doc == "TTFT_AFTER_E2E":
        doc = {"records": [_record(ttft_s=100.0, e2e_s=1.0)]}
    r = requests.request(method, service.url + path, json=doc, timeout=30)
    assert 400 <= r.status_code < 500, r.text
    error = r.json()["error"]
    assert error.get("field") == field, error
    assert field in error["message"], error
