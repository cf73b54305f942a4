"""Schemathesis fuzzes every operation of the drift service from its own /openapi.json and
holds the service to it: no 5xx, answers as documented (status codes, content types,
response schemas), every request the schema allows is accepted and every one it forbids is
refused, and every 4xx is an error object whose message says what was wrong.

What a JSON Schema cannot say (rules across fields: ``from`` before ``to``, weights adding
up to 1) the schema's descriptions state; valid cases are brought within those rules before
they are sent (``within_the_rules_across_fields``), so "valid" means valid by the whole
published contract. The service holds two segments with baselines and windows (so reads
reach scoring, A/B and the exact tests), and fleet drift asks a stand-in Prometheus on
loopback. Bounded: a fixed number of examples per operation and derandomised generation,
so a run is reproducible and takes seconds."""

from __future__ import annotations

import time

import pytest
import requests
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config._checks import NegativeDataRejectionConfig, PositiveDataAcceptanceConfig
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from inferwatch.drift.api import bins
from inferwatch.drift.feature_record import FIELDS, TEXT_MAX
from inferwatch.drift.service.app import DriftSettings, create_app
from tests.support.errors import error_names_what_was_wrong
from tests.support.feature_records import body, records
from tests.support.servers import AppServer

HOUR = 3600.0
EXAMPLES = 100
NOW = time.time()
BASELINE_RANGE = (NOW - 2 * HOUR, NOW - 1.5 * HOUR)
OPTIONS = {"resamples": 99, "max_body_bytes": 1_000_000}  # the schema depends on them (alpha's floor)


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
                                  prometheus_url=prometheus.url, **OPTIONS)
        app = create_app(settings_)
        with AppServer(app) as server:
            state = app.state.drift
            for variant in ("v1", "v2"):
                state.ingest.add(body(records(600, *BASELINE_RANGE, seed=1, variant=variant)))
                state.ingest.add(body([r | {"experiment": "exp", "epoch": 0, "weight": 0.5, "unit": f"u{i % 97}"}
                                   for i, r in enumerate(records(300, NOW - 600, NOW, seed=2, variant=variant))]))
                state.baselines.freeze(("m", variant), *BASELINE_RANGE)
                state.verdicts.calibrated(("m", variant))
            yield server


# The document the service serves (the test below checks it is the one at /openapi.json). Built
# at import: schemathesis's fixture-backed lazy loading does not run under pytest 9.
OPENAPI = create_app(DriftSettings(db_path=":memory:", **OPTIONS)).openapi()
schema = schemathesis.openapi.from_dict(OPENAPI)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
# Valid data may still find nothing to answer about (404: no records of that segment), a
# segment bound (409), a verdict outside pass_on (412) or a body over the configured size
# (413), all documented; invalid data is a 400 (query) or 422 (body), or a 413 when large.
schema.config.checks.positive_data_acceptance = PositiveDataAcceptanceConfig(
    expected_statuses=["2xx", "404", "409", "412", "413"])
schema.config.checks.negative_data_rejection = NegativeDataRejectionConfig(
    expected_statuses=["400", "404", "413", "422"])


def _other(name: str) -> str:
    """A variant name that is not ``name``, within the same constraints."""
    return name[:TEXT_MAX - 1] + ("b" if name.endswith("a") else "a")


def _typed(fields: dict, *numbers: str) -> dict:
    """Query values as the service reads them: the coverage phase sends numbers as text."""
    return {k: float(v) if k in numbers and isinstance(v, str) else v for k, v in fields.items()}


def _experiment(fields: dict) -> dict:
    """An A/B request's fields within its rules across fields (drift/ab/verdict.py's CROSS_FIELD_RULES)."""
    fields.setdefault("control", "v1")
    fields.setdefault("treatment", "v2")
    if fields["treatment"] == fields["control"]:
        fields["treatment"] = _other(fields["control"])
    if fields.get("scope") == "experiment":
        fields.pop("epoch", None)
    least = fields.get("min_units", 30)
    if fields.get("promote_units", 300) < least:
        fields["promote_units"] = least
    return fields


def _record(rec: dict) -> dict:
    for name, value in rec.items():  # an integer is written without a fraction, as the field says
        if isinstance(value, float) and FIELDS[name].kind is int:
            rec[name] = int(value)
    rec["finished_at"] = min(rec["finished_at"], NOW)
    rec["started_at"] = min(rec["started_at"], rec["finished_at"])
    if rec.get("ttft_s") is not None:
        rec["ttft_s"] = min(rec["ttft_s"], rec["e2e_s"])
    if rec.get("epoch") is None or rec.get("weight") is None:  # an assignment is whole or absent
        rec["epoch"] = rec["weight"] = None
    elif rec.get("experiment") is None:
        rec["experiment"] = "exp"
    return rec


def _baseline(doc: dict) -> dict:
    if "histograms" in doc:  # at least one positive count
        if not any(any(counts or ()) for counts in doc["histograms"].values()):
            doc["histograms"]["status_class"] = [1] + [0] * (bins("status_class") - 1)
    else:  # a range holding records of a segment the service has
        doc.update(model="m", variant="v1", **{"from": min(doc["from"], BASELINE_RANGE[0]),
                                               "to": max(doc["to"], BASELINE_RANGE[1])})
    return doc


@schema.hook("map_case")
def within_the_rules_across_fields(context, case):
    """A valid case, brought within the rules its operation's description states."""
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return case
    route = (case.method.upper(), case.operation.path)
    if route == ("POST", "/v1/ingest"):
        case.body["records"] = [_record(r) for r in case.body["records"]]
    elif route == ("POST", "/v1/feedback"):
        for rating in case.body["records"]:  # an epoch belongs to an experiment
            if rating.get("epoch") is not None and rating.get("experiment") is None:
                rating["experiment"] = "exp"
    elif route == ("POST", "/v1/baselines"):
        case.body = _baseline(case.body)
    elif route == ("GET", "/v1/ab/{model}"):
        case.query = _experiment(_typed(case.query or {}, "min_units", "promote_units"))
    elif route == ("POST", "/v1/ab/{model}"):
        doc = case.body if isinstance(case.body, dict) else {}
        if {"name", "namespace", "phase"} <= doc.keys():  # a Flagger webhook: an experiment as text in metadata
            doc["metadata"] = {"control": "v1", "treatment": "v2", "pass_on": "rollback,hold,continue,promote"}
        else:
            case.body = _experiment(doc)
    elif route == ("GET", "/v1/compare"):
        if case.query["a"] == case.query["b"]:
            case.query["b"] = _other(case.query["a"])
    elif route == ("GET", "/v1/fleet-drift"):
        query = _typed(case.query, "reference_end", "current_end")
        ref, cur = query["reference_end"], query.get("current_end", NOW)
        if ref >= cur:
            case.query["reference_end"] = cur - 1 if cur >= 1 else 0
            case.query["current_end"] = max(cur, 1)
    return case


def test_the_fuzzed_document_is_the_served_one(drift_service):
    assert requests.get(drift_service.url + "/openapi.json", timeout=10).json() == OPENAPI


def an_error_says_what_was_wrong(ctx, response, case) -> None:
    """Every 4xx but the A/B verdict's 412, which is the verdict itself (Flagger judges by status)."""
    if response.status_code != 412:
        error_names_what_was_wrong(ctx, response, case)


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
                                             response_schema_conformance, positive_data_acceptance,
                                             negative_data_rejection, an_error_says_what_was_wrong,
                                             a_bad_request_names_its_field])
