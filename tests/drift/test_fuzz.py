"""Schemathesis fuzzes every operation of the drift service from its own /openapi.json,
valid and invalid inputs alike: no 5xx, answers as documented (status codes, content types,
response schemas), and every 4xx is an error object whose message says what was wrong.

The service holds two segments with baselines and windows (so reads reach scoring, A/B and
the exact tests), and fleet drift asks a stand-in Prometheus on loopback. Bounded: a fixed
number of examples per operation and derandomised generation, so a run is reproducible and
takes seconds."""

from __future__ import annotations

import time

import pytest
import requests
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

from inferwatch.drift.service import DriftSettings, create_app
from tests.drift.records import body, records
from tests.support.errors import error_names_what_was_wrong
from tests.support.servers import AppServer

HOUR = 3600.0
EXAMPLES = 100


def stand_in_prometheus() -> FastAPI:
    """Answers every instant query with the same le buckets of a histogram."""
    app = FastAPI()

    @app.get("/api/v1/query")
    def query(time: float = 0.0) -> dict:
        cumulative = {"1": 40, "4": 300, "16": 900, "64": 1500, "+Inf": 1600}
        return {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"le": le}, "value": [time, str(count)]} for le, count in cumulative.items()]}}

    return app


@pytest.fixture(scope="module")
def drift_service(tmp_path_factory):
    with AppServer(stand_in_prometheus()) as prometheus:
        settings_ = DriftSettings(db_path=str(tmp_path_factory.mktemp("fuzz") / "drift.sqlite3"),
                                  prometheus_url=prometheus.url, resamples=99, max_body_bytes=1_000_000)
        app = create_app(settings_)
        with AppServer(app) as server:
            now = time.time()
            state = app.state.drift
            for variant in ("v1", "v2"):
                state.ingest(body(records(600, now - 2 * HOUR, now - 1.5 * HOUR, seed=1, variant=variant)))
                state.ingest(body(records(300, now - 600, now, seed=2, variant=variant)))
                state.freeze_baseline(("m", variant), now - 2 * HOUR, now - 1.5 * HOUR)
                state.calibrated_verdict(("m", variant))
            yield server


# The document the service serves (the test below checks it is the one at /openapi.json). Built
# at import: schemathesis's fixture-backed lazy loading does not run under pytest 9.
OPENAPI = create_app(DriftSettings(db_path=":memory:")).openapi()
schema = schemathesis.openapi.from_dict(OPENAPI)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])


def test_the_fuzzed_document_is_the_served_one(drift_service):
    assert requests.get(drift_service.url + "/openapi.json", timeout=10).json() == OPENAPI


def a_bad_request_names_its_field(ctx, response, case) -> None:
    """A 400 (query) or 422 (body) always has something to blame: the parameter, the field or
    the body itself. (401, 404, 405, 409 and 413 blame no field.)"""
    if response.status_code in (400, 422):
        assert response.json()["error"].get("field") is not None, f"{response.status_code} without a field: {response.text[:300]}"


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented(case, drift_service):
    response = case.call(base_url=drift_service.url, timeout=30)
    case.validate_response(response, checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                                             response_schema_conformance, error_names_what_was_wrong,
                                             a_bad_request_names_its_field])
