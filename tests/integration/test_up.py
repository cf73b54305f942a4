"""`inferwatch up` (what `make up` runs), end to end with real processes: vLLM (CPU), gateway,
exporter, drift service, Prometheus, Alertmanager and the local pager.

One stack serves every test in this module, in order. It runs with ``--fast-alerting``
(1 s scrape and evaluation, 1-2 s Alertmanager waits) and with the generated rules whose
``for`` durations are capped at 15 s (``alerts.generate.cap_for``): the documented test
override, since a test cannot wait out a 15 m ``for``. Everything else (expressions,
labels, annotations, routes, inhibitions) is what ships.
"""

from __future__ import annotations

import os
import signal
import time

import openai
import psutil
import pytest
import requests

from inferwatch.alerts.generate import cap_for, rule_files, write
from inferwatch.common.durations import seconds
from inferwatch.deploy.monitoring import FAST_INTERVALS
from tests.conftest import TINY_MODEL_NAME
from tests.exporters.driver import kernel_gpus
from tests.support.feature_records import body, records
from tests.support.local_stack import local_stack, port_open
from tests.support.waiting import eventually

pytestmark = pytest.mark.vllm
FOR_CAP = "15s"


@pytest.fixture(scope="module")
def stack(tiny_model, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("up")
    rules = run_dir / "rules"
    write(cap_for(rule_files(), FOR_CAP), rules)
    with local_stack(tiny_model, run_dir, "--rules-dir", str(rules)) as stack:
        yield stack


def test_up_prints_every_url_and_serves_through_the_gateway(stack):
    out = stack.reader.until("Ctrl-C stops everything", 300)
    for what, path in (("gateway", "/v1"), ("gateway", "/metrics"), ("vllm", "/metrics"), ("exporter", "/metrics"),
                       ("drift", "/report"), ("prometheus", ""), ("alertmanager", ""), ("pager", "/events"),
                       ("supervisor", "/metrics")):
        assert f"{stack.url(what)}{path}" in out, what
    alerts_page = next(line.split()[-1] for line in out.splitlines() if "Prometheus alerts" in line)
    assert requests.get(alerts_page, timeout=5).status_code == 200

    client = openai.OpenAI(base_url=f"{stack.url('gateway')}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=TINY_MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4)
    assert reply.usage.completion_tokens == 4
    # the exporter runs with or without a GPU and says which in its metrics
    nvml_up = "1.0" if kernel_gpus() else "0.0"
    assert f"inferwatch_nvml_up {nvml_up}" in requests.get(f"{stack.url('exporter')}/metrics").text
    # the request's feature record reaches the drift service that up started
    segs = eventually(lambda: requests.get(f"{stack.url('drift')}/v1/drift").json()["segments"])
    assert [(s["model"], s["window_records"]) for s in segs] == [(TINY_MODEL_NAME, 1)]


def test_prometheus_scrapes_every_part_of_the_stack(stack):
    def healthy_jobs():
        targets = requests.get(f"{stack.url('prometheus')}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return {t["labels"]["job"] for t in targets if t["health"] == "up"}

    want = {"prometheus", "alertmanager", "inferwatch-gateway", "vllm", "inferwatch-exporter", "inferwatch-drift",
            "inferwatch-supervisor"}
    eventually(lambda: healthy_jobs() >= want, timeout_s=30)
    rules = requests.get(f"{stack.url('prometheus')}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert {g["name"] for g in rules} >= {"inferwatch-page", "inferwatch-ticket", "inferwatch-slo-availability"}
    # every rule evaluated so far is healthy (the 5-minute SLO groups may not have run yet)
    assert all(r["health"] in ("ok", "unknown") for g in rules for r in g["rules"]), [
        (r["name"], r.get("lastError")) for g in rules for r in g["rules"] if r["health"] != "ok"]
    assert sum(r["health"] == "ok" for g in rules for r in g["rules"]) > 50


def test_watchdog_reaches_the_dead_mans_switch_and_nothing_pages_while_healthy(stack):
    eventually(lambda: stack.events(receiver="deadman", alertname="Watchdog"), timeout_s=30)
    deadline = time.monotonic() + 15  # traffic over several evaluation and `for` periods
    while time.monotonic() < deadline:
        assert stack.chat(2) == [200, 200]
        time.sleep(0.5)
    assert stack.events(receiver="pager") == []
    assert stack.events(receiver="ticket") == []


def test_shifted_feature_records_open_a_drift_ticket(stack):
    now = time.time()
    drift = stack.url("drift")
    reference = records(400, now - 7200, now - 5400, seed=1, model="drift-probe", variant="v1")
    assert requests.post(f"{drift}/v1/ingest", data=body(reference), timeout=10).status_code == 200
    frozen = requests.post(f"{drift}/v1/baselines", timeout=10,
                           json={"model": "drift-probe", "variant": "v1", "from": now - 7200, "to": now - 5400})
    assert frozen.status_code == 201, frozen.text
    shifted = records(400, now - 120, now, seed=2, model="drift-probe", variant="v1", prompt_mu=7.0)
    assert requests.post(f"{drift}/v1/ingest", data=body(shifted), timeout=10).status_code == 200

    tickets = eventually(lambda: [e for e in stack.events(receiver="ticket", alertname="DriftDetected")
                                  if e["labels"]["feature"] == "prompt_tokens"], timeout_s=60)
    t = tickets[0]
    assert t["status"] == "firing"
    assert {k: t["labels"][k] for k in ("model", "variant", "severity", "cluster")} == {
        "model": "drift-probe", "variant": "v1", "severity": "warning", "cluster": "local"}
    assert t["annotations"]["runbook_url"].endswith("/alerts/runbooks/DriftDetected.md")
    assert t["annotations"]["dashboard_url"].endswith("/d/inferwatch-drift")
    assert stack.events(receiver="pager") == []


def _vllm_leader_pid(port: int) -> int:
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return os.getpgid(conn.pid)
    raise AssertionError(f"nothing listens on {port}")


def test_vllm_killed_pages_and_its_automatic_return_resolves(stack):
    os.killpg(_vllm_leader_pid(stack.ports["vllm"]), signal.SIGKILL)
    stack.reader.until("restarting in", 15)

    pages = eventually(lambda: stack.events(receiver="pager", alertname="VLLMDown", status="firing"), timeout_s=60)
    page = pages[0]
    assert page["labels"] == {"alertname": "VLLMDown", "severity": "critical", "job": "vllm", "model": TINY_MODEL_NAME,
                              "instance": f"127.0.0.1:{stack.ports['vllm']}", "cluster": "local"}
    assert page["annotations"]["runbook_url"].endswith("/alerts/runbooks/VLLMDown.md")
    assert page["annotations"]["dashboard_url"].endswith("/d/inferwatch-serving")
    description = page["annotations"]["description"]
    assert "after serving" in description and "Every request routed to it fails" in description

    # users hit the outage: the availability SLO burns, but its page is inhibited while every
    # vLLM replica of the model is down (VLLMModelUnavailable), and for the outage's shadow after
    codes = []
    burning = []
    deadline = time.monotonic() + 40
    while not burning and time.monotonic() < deadline:
        codes += stack.chat(5)
        burning = stack.firing_in_prometheus("SLOErrorBudgetBurn")
        time.sleep(0.5)
    assert burning and set(codes) == {503}, (codes, burning)
    assert {a["labels"]["slo"] for a in burning} == {"availability"}

    # the supervisor brings vLLM back; Prometheus sees it and the page resolves
    stack.reader.until("healthy again", 240)
    # VLLMDown resolves once a minute has passed without a failed scrape
    resolved = eventually(lambda: stack.events(receiver="pager", alertname="VLLMDown", status="resolved"),
                          timeout_s=120)
    assert resolved[0]["labels"]["model"] == TINY_MODEL_NAME
    # no SLO page while vLLM was down (the shadow holds them after it too, unless the model
    # keeps failing; one group_interval of slack for the order Alertmanager flushes groups in)
    slack = seconds(FAST_INTERVALS.page.group_interval)
    slo_pages = stack.events(receiver="pager", alertname="SLOErrorBudgetBurn")
    assert all(e["received_at"] >= resolved[0]["received_at"] - slack for e in slo_pages), \
        "SLO paged while vLLM was down"
    assert not stack.events(receiver="pager", alertname="GatewayUpstreamDown")  # vLLM is the cause, not the path
    assert stack.chat(1) == [200]

    supervisor = requests.get(f"{stack.url('supervisor')}/metrics", timeout=5).text
    assert 'inferwatch_supervisor_restarts_total{child="vllm"} 1.0' in supervisor
    # the monitoring side never stopped
    assert 'inferwatch_supervisor_restarts_total{child="prometheus"} 0.0' in supervisor
    assert 'inferwatch_supervisor_restarts_total{child="alertmanager"} 0.0' in supervisor


def test_ctrl_c_stops_everything(stack):
    stack.proc.send_signal(signal.SIGINT)
    stack.proc.wait(timeout=120)
    rest = stack.reader.until("stopping vLLM", 5)
    assert stack.proc.returncode == 0, rest
    assert not any(port_open(p) for p in stack.ports.values())
    assert (stack.run_dir / "vllm.log").stat().st_size > 0 and (stack.run_dir / "prometheus.log").exists()
