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
from inferwatch.deploy.monitoring import FAST_HA_INTERVALS
from inferwatch.local_stack import HA_PORT_OFFSET
from tests.conftest import TINY_MODEL_NAME
from tests.exporters.driver import kernel_gpus
from tests.support.feature_records import body, records
from tests.support.local_stack import local_stack, monitoring_stack, port_open
from tests.support.prometheus_server import instant_query
from tests.support.waiting import eventually

pytestmark = pytest.mark.vllm
FOR_CAP = "15s"


@pytest.fixture(scope="module")
def stack(tiny_model, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("up")
    rules = run_dir / "rules"
    write(cap_for(rule_files(), FOR_CAP), rules)
    with local_stack(tiny_model, run_dir, "--rules-dir", str(rules), "--ha") as stack:
        yield stack


@pytest.fixture(scope="module")
def halves_lost(stack, tmp_path_factory):
    """Two more HA pairs (`inferwatch up --monitoring-only --ha`) watching the same vLLM, with
    the same rules and pagers of their own: the vLLM-killed test takes one's first
    Alertmanager and the other's first Prometheus away before the fault."""
    stack.reader.until("Ctrl-C stops everything", 300)
    rules = ("--rules-dir", str(stack.run_dir / "rules"), "--ha")
    with monitoring_stack(stack, tmp_path_factory.mktemp("am-lost"), *rules) as am_lost, \
            monitoring_stack(stack, tmp_path_factory.mktemp("prom-lost"), *rules) as prom_lost:
        for watcher in (am_lost, prom_lost):
            watcher.reader.until("Ctrl-C stops everything", 60)
        yield {"alertmanager": am_lost, "prometheus": prom_lost}


def test_up_prints_every_url_and_serves_through_the_gateway(stack, halves_lost):
    out = stack.reader.until("Ctrl-C stops everything", 300)
    for what, path in (("gateway", "/v1"), ("gateway", "/metrics"), ("vllm", "/metrics"), ("exporter", "/metrics"),
                       ("drift", "/report"), ("prometheus", ""), ("alertmanager", ""), ("pager", "/events"),
                       ("supervisor", "/metrics")):
        assert f"{stack.url(what)}{path}" in out, what
    # --ha: the second Prometheus and Alertmanager, the two Alertmanagers one gossip cluster
    for what in ("prometheus", "alertmanager"):
        assert f"http://127.0.0.1:{stack.ports[what] + HA_PORT_OFFSET}" in out, what
    eventually(lambda: _cluster(stack.url("alertmanager")) == ("ready", 2), timeout_s=60)
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


def _cluster(alertmanager: str) -> tuple[str, int]:
    """An Alertmanager's gossip cluster: its status and how many members it counts."""
    cluster = requests.get(f"{alertmanager}/api/v2/status", timeout=5).json()["cluster"]
    return cluster["status"], len(cluster["peers"])


def _listening_pid(port: int) -> int:
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return conn.pid
    raise AssertionError(f"nothing listens on {port}")


def _lose_first_half(watcher, what: str) -> None:
    """SIGKILL ``watcher``'s first Prometheus or Alertmanager, its supervisor paused so that it
    stays lost; once gone, the other Alertmanager has seen its peer leave the cluster."""
    watcher.proc.send_signal(signal.SIGSTOP)
    os.kill(_listening_pid(watcher.ports[what]), signal.SIGKILL)
    eventually(lambda: not port_open(watcher.ports[what]), timeout_s=10)
    if what == "alertmanager":
        other = f"http://127.0.0.1:{watcher.ports[what] + HA_PORT_OFFSET}"
        eventually(lambda: _cluster(other)[1] == 1, timeout_s=60)


def _has_served_for_a_minute(prometheus: str) -> bool:
    """VLLMDown counts failed scrapes only of a vLLM that Prometheus has seen serve a minute ago."""
    return bool(instant_query(prometheus, 'max_over_time(up{job="vllm"}[15m] offset 1m) == 1'))


def test_vllm_killed_pages_once_with_either_half_of_the_monitoring_lost_and_its_return_resolves(stack, halves_lost):
    pairs = {"both halves": stack, **{f"{what} lost": w for what, w in halves_lost.items()}}
    for pair in pairs.values():
        for offset in (0, HA_PORT_OFFSET):
            prometheus = f"http://127.0.0.1:{pair.ports['prometheus'] + offset}"
            eventually(lambda url=prometheus: _has_served_for_a_minute(url), timeout_s=90)
    try:
        for what, watcher in halves_lost.items():
            _lose_first_half(watcher, what)
        killed_at = time.time()
        os.killpg(os.getpgid(_listening_pid(stack.ports["vllm"])), signal.SIGKILL)
        stack.reader.until("restarting in", 15)
        _vllm_killed_pages_and_its_automatic_return_resolves(stack)
        resolved = {name: eventually(lambda p=pair: p.events(receiver="pager", alertname="VLLMDown", status="resolved"),
                                     timeout_s=120) for name, pair in pairs.items()}
        # a second notification from the Alertmanager that waits for its peer would come its
        # peer timeout (15 s) after the first's
        time.sleep(max(0.0, max(r[0]["received_at"] for r in resolved.values()) + 20 - time.time()))
        latency = {}
        for name, pair in pairs.items():
            pages = pair.events(receiver="pager", alertname="VLLMDown")
            assert [p["status"] for p in pages] == ["firing", "resolved"], (name, pages)
            assert "prometheus_replica" not in pages[0]["labels"], name
            latency[name] = pages[0]["received_at"] - killed_at
        print("\nVLLMDown page after the kill: " + ", ".join(f"{k} {v:.1f}s" for k, v in latency.items()))
    finally:
        for watcher in halves_lost.values():
            watcher.proc.send_signal(signal.SIGCONT)


def _vllm_killed_pages_and_its_automatic_return_resolves(stack) -> None:
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
    slack = seconds(FAST_HA_INTERVALS.page.group_interval)
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
