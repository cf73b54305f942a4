"""Routing and inhibition in a real Alertmanager: alerts posted to its API as Prometheus
would, notifications read back from the local pager."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests

from inferwatch.alerts.pager import create_app
from inferwatch.alerts.routing import Receivers, Timing
from inferwatch.deploy.monitoring import Intervals, Targets, alertmanager_process, write_local_configs
from tests.support.servers import AppServer
from tests.support.sockets import free_ports
from tests.support.waiting import eventually

QUICK = Timing("1s", "1s", "1h")
# the shipped dead man's switch timing (1m / 50s) at a sixtieth of the scale
HEARTBEAT = Timing("0s", "1s", "833ms")


@pytest.fixture
def alertmanager(tmp_path):
    am_port, prom_port = free_ports(2)
    with AppServer(create_app()) as pager:
        hooks = f"{pager.url}/hooks"
        _, am_cfg = write_local_configs(
            tmp_path, Targets(prometheus=(f"127.0.0.1:{prom_port}",), alertmanager=(f"127.0.0.1:{am_port}",)),
            Receivers(f"{hooks}/pager", f"{hooks}/ticket", f"{hooks}/deadman"),
            Intervals(page=QUICK, ticket=QUICK, deadman=HEARTBEAT))
        proc = alertmanager_process(am_cfg, tmp_path / "am-data", "127.0.0.1", am_port, tmp_path / "am.log")
        proc.start()
        try:
            proc.wait_healthy(30, poll_s=0.1)
            yield f"http://127.0.0.1:{am_port}", pager
        finally:
            proc.stop()


def post(am_url: str, *alerts: dict[str, str]) -> None:
    now = datetime.now(UTC)
    body = [{"labels": {"cluster": "local", **labels}, "annotations": {"summary": labels["alertname"]},
             "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=5)).isoformat()} for labels in alerts]
    assert requests.post(f"{am_url}/api/v2/alerts", json=body, timeout=5).status_code == 200


def received(pager: AppServer) -> set[tuple[str, str, str]]:
    events = requests.get(f"{pager.url}/events", timeout=5).json()["events"]
    return {(e["receiver"], e["labels"]["alertname"], e["labels"].get("model") or e["labels"].get("instance", ""))
            for e in events}


def test_tiers_reach_their_receivers_and_causes_silence_their_symptoms(alertmanager):
    am_url, pager = alertmanager
    post(am_url,
         # every replica of m1 is down: VLLMDown pages for each, and m1's SLO alerts are the outage's
         {"alertname": "VLLMDown", "severity": "critical", "model": "m1", "instance": "vllm-a:8000"},
         {"alertname": "VLLMModelUnavailable", "severity": "none", "model": "m1"},
         {"alertname": "SLOErrorBudgetBurn", "severity": "critical", "model": "m1", "slo": "availability"},
         {"alertname": "VLLMKVCacheSaturated", "severity": "warning", "model": "m1", "instance": "vllm-a:8000"},
         # one replica of m4 is down, the other answers but burns: its page goes out
         {"alertname": "VLLMDown", "severity": "critical", "model": "m4", "instance": "vllm-b:8000"},
         {"alertname": "SLOErrorBudgetBurn", "severity": "critical", "model": "m4", "slo": "ttft"},
         {"alertname": "VLLMKVCacheSaturated", "severity": "warning", "model": "m4", "instance": "vllm-c:8000"},
         # another model: not inhibited
         {"alertname": "SLOErrorBudgetBurn", "severity": "critical", "model": "m2", "slo": "availability"},
         # the page inhibits the ticket of the same alert, model and SLO, not of another SLO
         {"alertname": "SLOErrorBudgetBurn", "severity": "warning", "model": "m2", "slo": "availability"},
         {"alertname": "SLOErrorBudgetBurn", "severity": "warning", "model": "m3", "slo": "ttft"},
         {"alertname": "DriftDetected", "severity": "warning", "model": "m1", "feature": "prompt_tokens"},
         {"alertname": "GPUPowerCapped", "severity": "info", "instance": "n1"},
         {"alertname": "Watchdog", "severity": "none"})
    want = {
        ("pager", "VLLMDown", "m1"), ("pager", "VLLMDown", "m4"), ("pager", "SLOErrorBudgetBurn", "m4"),
        ("ticket", "VLLMKVCacheSaturated", "m4"), ("pager", "SLOErrorBudgetBurn", "m2"),
        ("ticket", "SLOErrorBudgetBurn", "m3"), ("ticket", "DriftDetected", "m1"), ("deadman", "Watchdog", ""),
    }
    eventually(lambda: received(pager) >= want, timeout_s=15)
    time.sleep(3)  # several group intervals: nothing else arrives
    assert received(pager) == want


def test_the_watchdog_heartbeat_goes_out_at_every_group_interval(alertmanager):
    am_url, pager = alertmanager
    post(am_url, {"alertname": "Watchdog", "severity": "none"})
    time.sleep(6.5)
    beats = [e["received_at"] for e in requests.get(f"{pager.url}/events", params={"receiver": "deadman"},
                                                     timeout=5).json()["events"]]
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert len(beats) >= 6 and max(gaps) < 1.6, gaps  # not every other interval
