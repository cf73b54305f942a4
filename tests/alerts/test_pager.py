"""The local pager: Alertmanager's webhook payload in, readable lines and JSON events out."""

from __future__ import annotations

import logging

import requests

from inferwatch.alerts.pager import create_app
from tests.support.servers import AppServer

PAYLOAD = {
    "version": "4", "status": "firing", "receiver": "pager", "groupLabels": {"alertname": "VLLMDown"},
    "alerts": [{
        "status": "firing", "fingerprint": "abc", "startsAt": "2026-11-30T05:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
        "labels": {"alertname": "VLLMDown", "severity": "critical", "model": "m1", "instance": "vllm:8000"},
        "annotations": {"summary": "vLLM vllm:8000 is down", "runbook_url": "https://x/VLLMDown.md",
                        "dashboard_url": "http://g/d/inferwatch-serving"},
    }],
}


def test_pages_are_logged_readably_and_served_as_json(caplog):
    with caplog.at_level(logging.WARNING, logger="inferwatch.alerts.pager"), AppServer(create_app()) as pager:
        r = requests.post(f"{pager.url}/hooks/pager", json=PAYLOAD, timeout=5)
        assert r.status_code == 200 and r.json() == {"received": 1}
        resolved = {**PAYLOAD, "alerts": [{**PAYLOAD["alerts"][0], "status": "resolved"}]}
        requests.post(f"{pager.url}/hooks/pager", json=resolved, timeout=5)
        events = requests.get(f"{pager.url}/events", params={"receiver": "pager"}, timeout=5).json()["events"]
        assert [e["status"] for e in events] == ["firing", "resolved"]
        assert events[0]["labels"]["model"] == "m1"
        assert requests.get(f"{pager.url}/events", params={"status": "resolved"}).json()["events"][0]["fingerprint"] \
            == "abc"
        assert requests.get(f"{pager.url}/events", params={"receiver": "ticket"}).json()["events"] == []
    line = caplog.records[0].getMessage()
    assert line.startswith("PAGER FIRING VLLMDown [critical] instance=vllm:8000 model=m1")
    assert "runbook: https://x/VLLMDown.md" in line and "dashboard: http://g/d/inferwatch-serving" in line


def test_bad_input_gets_a_clear_4xx_and_stores_nothing():
    with AppServer(create_app()) as pager:
        cases = [
            (b"not json", 400, "not JSON"),
            (b'{"alerts": "x"}', 400, "'alerts' list"),
            (b'{"alerts": [{"labels": {}, "status": "maybe"}]}', 400, "alerts[0]"),
        ]
        for data, status, message in cases:
            r = requests.post(f"{pager.url}/hooks/pager", data=data, timeout=5)
            assert r.status_code == status and message in r.json()["error"], r.text
        r = requests.post(f"{pager.url}/hooks/bad%20name", json=PAYLOAD, timeout=5)
        assert r.status_code == 404
        r = requests.post(f"{pager.url}/hooks/pager", data=b"x" * (5 * 1024 * 1024), timeout=10)
        assert r.status_code == 413
        assert requests.get(f"{pager.url}/events").json()["events"] == []


def test_odd_payloads_are_refused_whole_and_cannot_forge_log_lines(caplog):
    with caplog.at_level(logging.WARNING, logger="inferwatch.alerts.pager"), AppServer(create_app()) as pager:
        alert = PAYLOAD["alerts"][0]
        for bad in ({**alert, "annotations": "abc"}, {**alert, "labels": {"a": 1}}, {**alert, "annotations": ["x"]}):
            r = requests.post(f"{pager.url}/hooks/pager", json={"alerts": [alert, bad]}, timeout=5)
            assert r.status_code == 400 and "alerts[1]" in r.json()["error"], r.text
        r = requests.post(f"{pager.url}/hooks/pager", json={"alerts": [alert] * 1001}, timeout=10)
        assert r.status_code == 400 and "at most 1000" in r.json()["error"]

        def chunks():  # no Content-Length: the limit must hold while streaming
            for _ in range(64):
                yield b" " * (128 * 1024)
        r = requests.post(f"{pager.url}/hooks/pager", data=chunks(), timeout=10)
        assert r.status_code == 413
        assert requests.get(f"{pager.url}/events").json()["events"] == []

        forged = {**alert, "labels": {**alert["labels"], "x": "\n2026-01-01 PAGER FIRING Forged [critical]"}}
        assert requests.post(f"{pager.url}/hooks/pager", json={"alerts": [forged]}, timeout=5).status_code == 200
    message = caplog.records[-1].getMessage()
    assert not any(line.startswith("2026-01-01") for line in message.splitlines())
    assert "\\n2026-01-01 PAGER FIRING Forged" in message
