"""The feature record contract end to end: the records the gateway really sends (its own
request path, its own HttpSink) are accepted by the drift service's real ingest endpoint,
and the contract's bounds (drift/feature_record.py) are where the service draws the line.

No vLLM: a stub upstream answers, misbehaves and is left mid-stream, so the gateway sends
the record shapes that are hard to get from a healthy server (error statuses, a client that
left, no usage, an experiment's assignment)."""

from __future__ import annotations

import dataclasses
import time

import jsonschema
import orjson
import pytest
import requests

from inferwatch.drift.feature_record import FIELDS, MAX_FUTURE_S, TEXT_FIELDS, TEXT_MAX, FeatureRecord, ingest_body
from inferwatch.drift.service.app import DriftSettings, create_app
from inferwatch.serving.settings import GatewaySettings
from tests.support.servers import AppServer, GatewayServer, metric_sum
from tests.support.stub_upstream import StubUpstream
from tests.support.waiting import eventually

TOKEN = "t0k"
AUTH = {"authorization": f"Bearer {TOKEN}"}
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def drift():
    app = create_app(DriftSettings(db_path=":memory:", token=TOKEN))
    with AppServer(app) as server:
        yield server


@pytest.fixture(scope="module")
def stub():
    with StubUpstream() as s:
        yield s


def ingested(drift: AppServer) -> float:
    return metric_sum(drift.metrics_text(), "inferwatch_drift_ingested_records_total")


def refused(drift: AppServer) -> float:
    return metric_sum(drift.metrics_text(), "inferwatch_drift_rejected_batches_total")


def chat(gw: GatewayServer, model: str, *, stream: bool = False, **extra) -> requests.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream, **extra}
    return requests.post(gw.url + CHAT, json=body, timeout=15)


def leave_mid_stream(gw: GatewayServer) -> None:
    """A client that reads the first chunk of a long answer and hangs up: the gateway records a 499."""
    body = {"model": "long_stream", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with requests.post(gw.url + CHAT, json=body, stream=True, timeout=15) as r:
        next(r.iter_content(1024))


def test_every_record_the_gateway_sends_is_accepted_by_the_drift_service(drift, stub, tmp_path):
    experiments = tmp_path / "experiments.yaml"
    experiments.write_text(f"""
experiments:
  chat:
    name: canary-1
    variants:
      - {{name: v1, upstream_url: "{stub.url}", model: ok, weight: 0.5}}
      - {{name: v2, upstream_url: "{stub.url}", model: ok, weight: 0.5}}
""")
    settings = GatewaySettings(upstream_url=stub.url, drift_url=drift.url, drift_token=TOKEN, feature_flush_s=0.05,
                               feature_batch_size=4, experiment_file=experiments, upstream_timeout_s=5.0)
    before, refused_before = ingested(drift), refused(drift)
    with GatewayServer(settings) as gw:
        chat(gw, "ok")
        chat(gw, "ok", stream=True)
        chat(gw, "ok", stream=True, stream_options={"include_usage": True})
        for user in ("ann", "bob", "cy"):  # assigned by the experiment: experiment and hashed unit in the record
            chat(gw, "chat", user=user, stream=user != "bob")
        for broken in ("http500", "garbage", "cut", "error_event", "bad_request_event"):
            chat(gw, broken, stream=broken != "http500")
        requests.post(gw.url + "/v1/completions", json={"model": "ok", "prompt": "hi"}, timeout=15)  # upstream 404
        leave_mid_stream(gw)

        def records(outcome: str) -> float:
            return metric_sum(gw.metrics_text(), "inferwatch_gateway_feature_records_total", outcome=outcome)

        eventually(lambda: records("queued") == 13)
        eventually(lambda: records("sent") == 13)
        answered = {s: metric_sum(gw.metrics_text(), "inferwatch_gateway_requests_total", status_class=s)
                    for s in ("4xx", "5xx")}
        assert records("dropped_send_error") == 0
    assert ingested(drift) - before == 13
    assert refused(drift) == refused_before
    assert answered["4xx"] >= 2 and answered["5xx"] >= 3  # the failures were answered as failures, and recorded


def _record(now: float, **changes) -> FeatureRecord:
    record = FeatureRecord(model="m", variant="v1", route="chat", stream=True, started_at=now - 2.0,
                           finished_at=now - 1.0, status=200, prompt_tokens=10, completion_tokens=5, ttft_s=0.1,
                           tpot_s=0.02, e2e_s=1.0, finish_reason="stop", mean_logprob=-1.25, experiment="e", unit="u",
                           epoch=3, weight=0.25)
    return dataclasses.replace(record, **changes)


def _ingest(drift: AppServer, *records: FeatureRecord) -> requests.Response:
    """Sent as the gateway's HttpSink sends them: its own serialisation."""
    return requests.post(drift.url + "/v1/ingest", data=ingest_body(records),
                         headers={**AUTH, "content-type": "application/json"}, timeout=10)


def _at_bound(now: float, name: str, end: int) -> object:
    """A field's value at the low (0) or high (1) end of its declared range, kept consistent
    with the rules across fields (times are unix seconds no later than now)."""
    low, high = FIELDS[name].bounds  # type: ignore[misc]
    value = (low, high)[end]
    if name in ("started_at", "finished_at") and end:
        value = now - 1.0
    return int(value) if FIELDS[name].kind is int else value


RANGED = [name for name, rule in FIELDS.items() if rule.bounds is not None]


@pytest.mark.parametrize("name", RANGED)
def test_each_bound_of_the_contract_is_accepted(drift, name):
    now = time.time()
    for end in (0, 1):
        changes = {name: _at_bound(now, name, end)}
        if name == "e2e_s" and end == 0:
            changes["ttft_s"] = 0.0  # ttft_s <= e2e_s
        if name == "ttft_s" and end == 1:
            changes["e2e_s"] = changes["ttft_s"]
        if name == "finished_at" and end == 0:
            changes["started_at"] = 0.0  # started_at <= finished_at
        r = _ingest(drift, _record(now, **changes))
        assert r.status_code == 200, (changes, r.text)


@pytest.mark.parametrize("name", RANGED)
def test_just_beyond_each_bound_is_refused_naming_record_and_field(drift, name):
    now = time.time()
    low, high = FIELDS[name].bounds  # type: ignore[misc]
    step = 1 if FIELDS[name].kind is int else max(abs(high), 1.0) * 1e-9
    for beyond in (low - step, high + step):
        if name in ("started_at", "finished_at") and beyond > high:
            continue  # the future rule refuses it first; its own test is below
        value = int(beyond) if FIELDS[name].kind is int else beyond
        r = _ingest(drift, _record(now), _record(now, **{name: value}))
        assert r.status_code == 422, (name, value, r.text)
        error = r.json()["error"]
        assert (error["record"], error["field"]) == (1, name), error


@pytest.mark.parametrize("name", TEXT_FIELDS)
def test_labels_take_one_to_text_max_characters(drift, name):
    now = time.time()
    assert _ingest(drift, _record(now, **{name: "x" * TEXT_MAX})).status_code == 200
    assert _ingest(drift, _record(now, **{name: "x"})).status_code == 200
    for bad in ("", "x" * (TEXT_MAX + 1)):
        r = _ingest(drift, _record(now, **{name: bad}))
        assert r.status_code == 422 and r.json()["error"]["field"] == name, r.text


def test_every_nullable_field_may_be_null_and_every_other_is_required(drift):
    now = time.time()
    nullable = {name: None for name, rule in FIELDS.items() if rule.nullable}
    assert _ingest(drift, _record(now, **nullable)).status_code == 200
    for name, rule in FIELDS.items():
        if not rule.nullable:
            r = _ingest(drift, _record(now, **{name: None}))
            assert r.status_code == 422 and r.json()["error"]["field"] == name, r.text


def test_the_rules_across_fields_hold_at_their_edge(drift):
    now = time.time()
    assert _ingest(drift, _record(now, started_at=now - 1.0, finished_at=now - 1.0)).status_code == 200
    assert _ingest(drift, _record(now, ttft_s=1.0, e2e_s=1.0)).status_code == 200
    assert _ingest(drift, _record(now, started_at=now, finished_at=now + MAX_FUTURE_S - 30)).status_code == 200
    for changes, field in (({"started_at": now, "finished_at": now - 1.0}, "started_at"),
                           ({"ttft_s": 1.5, "e2e_s": 1.0}, "ttft_s"),
                           ({"finished_at": now + MAX_FUTURE_S + 60}, "finished_at"),
                           ({"weight": None}, "weight"), ({"epoch": None}, "epoch"),
                           ({"experiment": None}, "experiment")):
        r = _ingest(drift, _record(now, **changes))
        assert r.status_code == 422 and r.json()["error"]["field"] == field, (changes, r.text)


def test_the_published_schema_is_the_contract(drift):
    """The OpenAPI's FeatureRecord lists exactly the record's fields, and a gateway record
    validates against it; the same record beyond a bound does not."""
    doc = requests.get(drift.url + "/openapi.json", timeout=10).json()
    schema = doc["components"]["schemas"]["FeatureRecord"]
    assert list(schema["properties"]) == [f.name for f in dataclasses.fields(FeatureRecord)] == list(FIELDS)
    assert sorted(schema["required"]) == sorted(n for n, r in FIELDS.items() if not r.nullable)
    assert schema["additionalProperties"] is False
    now = time.time()
    jsonschema.validate(orjson.loads(orjson.dumps(_record(now))), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(orjson.loads(orjson.dumps(_record(now, status=600))), schema)
