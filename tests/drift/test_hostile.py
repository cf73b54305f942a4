"""Hostile input: every input that answered 500 now gets a 4xx naming what was wrong, a
flood of new model names stays bounded, idle segments expire with their series, and
/openapi.json describes every path."""

from __future__ import annotations

import time

import pytest
import requests

from inferwatch.drift.schema import FEATURES
from inferwatch.drift.service.app import DriftSettings, create_app
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.store import Store
from inferwatch.drift.window_config import OTHER_SEGMENT, WindowConfig
from tests.support.clock import Clock
from tests.support.feature_records import body, records
from tests.support.servers import AppServer, metric_sum


@pytest.fixture
def service(tmp_path):
    settings = DriftSettings(db_path=str(tmp_path / "drift.sqlite3"), max_segments=50)
    with AppServer(create_app(settings)) as server:
        yield server


@pytest.mark.parametrize("field, value", [
    ("status", 2**63), ("status", 2**64 - 1), ("mean_logprob", -1e308), ("mean_logprob", 1e308),
    ("prompt_tokens", 2**64 - 1), ("e2e_s", 1e300), ("finished_at", -1.0), ("started_at", 2**63),
])
def test_out_of_range_numbers_are_a_422_naming_the_field(service, field, value):
    now = time.time()
    batch = records(5, now - 10, now, seed=1)
    batch[2][field] = value
    with requests.Session() as session:  # one keep-alive connection for both requests
        r = session.post(service.url + "/v1/ingest", data=body(batch), timeout=10)
        assert r.status_code == 422, r.text
        assert (r.json()["error"]["record"], r.json()["error"]["field"]) == (2, field)
        assert session.get(service.url + "/health", timeout=10).status_code == 200
    assert requests.get(service.url + "/v1/drift", timeout=10).json() == {"segments": []}  # nothing applied


def test_baseline_count_that_overflows_is_a_422(service):
    counts = [0] * FEATURES["prompt_tokens"].edges.bins
    counts[3] = 2**63
    r = requests.post(service.url + "/v1/baselines", json={"model": "m", "variant": "v", "histograms":
                                                           {"prompt_tokens": counts}}, timeout=10)
    assert r.status_code == 422 and r.json()["error"]["field"] == "histograms.prompt_tokens.3"


@pytest.mark.parametrize("params, field", [
    ({"window": "inf"}, "window"), ({"window": "nan"}, "window"), ({"window": "1e400"}, "window"),
    ({"reference_end": "nan"}, "reference_end"), ({"current_end": "inf"}, "current_end"),
])
def test_fleet_drift_refuses_non_finite_numbers(service, params, field):
    query = {"metric": "inferwatch_gateway_request_prompt_tokens", "reference_end": "1000", "current_end": "2000",
             **params}
    r = requests.get(service.url + "/v1/fleet-drift", params=query, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["field"] == field, r.text


def test_exact_endpoint_with_extreme_but_valid_values(service):
    now = time.time()
    ref = records(300, now - 7200, now - 5400, seed=2)
    for rec in ref:
        rec["mean_logprob"] = -1e6  # the lowest accepted value
    requests.post(service.url + "/v1/ingest", data=body(ref), timeout=10).raise_for_status()
    requests.post(service.url + "/v1/baselines", json={"model": "m", "variant": "v1", "from": now - 7200,
                                                       "to": now - 5400}, timeout=10).raise_for_status()
    requests.post(service.url + "/v1/ingest", data=body(records(300, now - 60, now, seed=3)),
                  timeout=10).raise_for_status()
    r = requests.get(service.url + "/v1/drift/exact", params={"model": "m", "variant": "v1",
                                                              "feature": "mean_logprob"}, timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    # one name, one quantity: W1 over the reference's spread, as in /v1/drift; raw W1 apart. The
    # reference is constant (std 0), so the scale is its mean's magnitude, as wasserstein_normed does
    got = r.json()
    assert got["w1"] == pytest.approx(1e6, rel=1e-3) and got["wasserstein"] == pytest.approx(got["w1"] / 1e6)
    assert requests.get(service.url + "/v1/drift/exact", params={"model": "m", "variant": "v1",
                                                                  "feature": "colour"}, timeout=10).status_code == 400


def test_a_flood_of_model_names_stays_bounded(service):
    """One batch of 10,000 records with 10,000 new model names: the first 50 segments are
    kept, the rest is counted in model=variant=other; /metrics and /health stay small and fast."""
    now = time.time()
    batch = records(10_000, now - 60, now, seed=4)
    for i, rec in enumerate(batch):
        rec["model"] = f"model-{i}"
    t0 = time.monotonic()
    r = requests.post(service.url + "/v1/ingest", data=body(batch), timeout=60)
    assert r.status_code == 200 and r.json()["accepted"] == 10_000
    health = requests.get(service.url + "/health", timeout=10).json()
    assert health["segments"] == 50 and health["overflow_records"] == 10_000 - 49
    text = service.metrics_text()
    assert time.monotonic() - t0 < 20
    assert len(text) < 100_000
    assert metric_sum(text, "inferwatch_drift_window_records", model="other", variant="other") == 10_000 - 49
    assert metric_sum(text, "inferwatch_drift_overflow_records_total") == 10_000 - 49
    assert health["window_bytes"] < 50 * 20_000  # about 10 KB per one-bucket segment
    # a baseline for yet another segment is refused, clearly
    r = requests.post(service.url + "/v1/baselines", json={"model": "new", "variant": "v", "from": now - 60,
                                                           "to": now}, timeout=10)
    assert r.status_code == 409 and "MAX_SEGMENTS" in r.json()["error"]["message"]


def test_idle_segments_expire_with_their_series(tmp_path):
    clock = Clock(5_000_000.0)
    state = DriftState(Store(":memory:"), WindowConfig(window_s=600, buckets=6, max_segments=3),
                       clock=clock)
    for model in ("a", "b", "c", "d"):
        state.ingest.add(body(records(10, clock.now - 30, clock.now, seed=5, model=model)))
    assert state.ingest.segments() == [("a", "v1"), ("b", "v1"), OTHER_SEGMENT]
    clock.now += 700  # everything slid out
    state.ingest.add(body(records(10, clock.now - 30, clock.now, seed=6, model="e")))
    assert state.ingest.segments() == [("e", "v1")] and state.ingest.expired == 3


def test_openapi_lists_every_path_with_schemas(service):
    doc = requests.get(service.url + "/openapi.json", timeout=10).json()
    paths = doc["paths"]
    for path in ("/v1/ingest", "/v1/baselines", "/v1/drift", "/v1/drift/exact", "/v1/fleet-drift", "/v1/thresholds",
                 "/v1/compare", "/v1/features", "/report", "/metrics", "/health"):
        assert path in paths, path
    ingest = paths["/v1/ingest"]["post"]
    assert ingest["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/IngestRequest")
    schemas = doc["components"]["schemas"]
    record = schemas["FeatureRecord"]["properties"]
    assert record["status"]["maximum"] == 599 and "mean_logprob" in record
    assert paths["/v1/drift"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/DriftResponse")
    assert "threshold_source" in schemas["MethodResult"]["properties"]
    window = next(p for p in paths["/v1/fleet-drift"]["get"]["parameters"] if p["name"] == "window")
    assert window["schema"]["exclusiveMinimum"] == 0
