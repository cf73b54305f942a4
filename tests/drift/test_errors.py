"""Errors nobody planned for: an exception in a handler is a JSON 500 in the service's error
shape, logged with its traceback and counted, and the keep-alive connection it arrived on
still answers the next request; routing's 404 and 405 use the same shape."""

from __future__ import annotations

import http.client
import json
import logging

import pytest

from inferwatch.drift.service.app import DriftSettings, create_app
from tests.support.servers import AppServer, metric_sum


@pytest.fixture
def service(tmp_path):
    with AppServer(create_app(DriftSettings(db_path=str(tmp_path / "drift.sqlite3")))) as server:
        yield server


def test_an_unexpected_exception_is_a_json_500_and_the_connection_stays_usable(service, caplog):
    state = service.app.state.drift

    bugs = [ZeroDivisionError("a bug")]

    def broken(segment):  # fails once, on the request below
        if bugs:
            raise bugs.pop()

    state.ingest.segments = lambda: [("m", "v1")]
    state.verdicts.verdict = broken
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    with caplog.at_level(logging.ERROR, logger="inferwatch.drift.errors"):
        conn.request("GET", "/v1/drift")
        r = conn.getresponse()
        payload = json.loads(r.read())
    assert r.status == 500 and r.getheader("content-type") == "application/json"
    assert payload["error"]["code"] == "internal_error" and payload["error"]["type"] == "server_error"
    assert "GET /v1/drift" in payload["error"]["message"] and "ZeroDivisionError" in payload["error"]["message"]
    assert "a bug" not in payload["error"]["message"]  # internals stay in the log
    assert "Traceback" in caplog.text and "ZeroDivisionError: a bug" in caplog.text
    sock = conn.sock
    assert sock is not None  # the server did not ask to close it
    conn.request("GET", "/health")  # same connection: not reset
    second = conn.getresponse()
    assert second.status == 200 and json.loads(second.read())["status"] == "ok" and conn.sock is sock
    conn.close()
    assert metric_sum(service.metrics_text(), "inferwatch_drift_internal_errors_total", route="/v1/drift") == 1


@pytest.mark.parametrize("method, path, status, code, fragment", [
    ("GET", "/v2/nothing", 404, "not_found", "/openapi.json"),
    ("DELETE", "/v1/drift", 405, "method_not_allowed", "Allow"),
])
def test_routing_errors_use_the_error_shape(service, method, path, status, code, fragment):
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    conn.request(method, path)
    r = conn.getresponse()
    err = json.loads(r.read())["error"]
    assert r.status == status and err["code"] == code and path in err["message"] and fragment in err["message"]
    if status == 405:
        assert r.getheader("allow") == "GET"
