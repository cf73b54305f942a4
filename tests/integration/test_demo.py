"""`inferwatch demo` against `inferwatch up` (real vLLM on the CPU, gateway with the slow
canary's relay, drift service, Prometheus, Alertmanager, the local pager), at a pace that
fits a test run, checked where an SRE would look, independently of what the demo reports:
the pager's pages, the drift service's verdicts, the gateway's and vLLM's own counters.

The stack runs with ``--fast-alerting`` (1 s scrape and evaluation) and the rules as they
ship (no ``for`` capped): the outage (vLLM killed, restarted by `inferwatch up`) must page
VLLMDown alone, though the canary's relay loses vLLM too. With INFERWATCH_PREVIEW_DIR set, the run also draws the
serving, SLO and drift previews over the demo's span (the GPU preview needs the fake GPUs
of tests/integration/test_dashboards_live.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from inferwatch.dashboards.generate import dashboards
from inferwatch.dashboards.preview import render
from inferwatch.dashboards.queries import TimeRange
from inferwatch.demo.scenarios import BURST_CLIENTS, SCENARIOS
from tests.conftest import TINY_MODEL_NAME
from tests.support.local_stack import Stack, local_stack
from tests.support.servers import metric_sum
from tests.support.waiting import eventually

pytestmark = pytest.mark.vllm
PACE = 0.3
MAX_REQUESTS = 3000
AB_MODEL = f"{TINY_MODEL_NAME}-ab"
CANARY_DELAY_S = 0.3  # `inferwatch up`'s default --canary-delay


@dataclass
class DemoRun:
    result: subprocess.CompletedProcess
    started: float
    ended: float
    gateway_before: float


def gateway_requests(stack: Stack) -> float:
    return metric_sum(requests.get(f"{stack.url('gateway')}/metrics", timeout=10).text,
                      "inferwatch_gateway_requests_total")


@pytest.fixture(scope="module")
def stack(tiny_model, tmp_path_factory):
    with local_stack(tiny_model, tmp_path_factory.mktemp("demo")) as stack:
        stack.reader.until("Ctrl-C stops everything", 300)
        yield stack


@pytest.fixture(scope="module")
def run(stack):
    before = gateway_requests(stack)
    started = time.time()
    result = subprocess.run([sys.executable, "-m", "inferwatch", "demo", "--pace", str(PACE), "--max-requests",
                             str(MAX_REQUESTS), "--run-dir", str(stack.run_dir), *stack.url_flags()],
                            capture_output=True, text=True, timeout=900)
    return DemoRun(result, started, time.time(), before)


def test_the_demo_announces_each_scenario_sees_its_effects_and_stops_by_itself(run):
    out = run.result.stdout
    assert run.result.returncode == 0, out + run.result.stderr
    for i, sc in enumerate(SCENARIOS.values(), 1):
        assert f"[{i}/{len(SCENARIOS)}] {sc.title}" in out
        assert all(line in out for line in sc.announce), sc.name
    assert "NOT SEEN" not in out and "Every announced effect was seen." in out


def test_the_demo_sends_no_more_than_its_budget(stack, run):
    left = int(run.result.stdout.split(" requests of its budget left")[0].rsplit(" ", 1)[-1])
    sent = MAX_REQUESTS - left
    counted = gateway_requests(stack) - run.gateway_before  # every answer the gateway gave, any model
    # requests the outage's client gave up on may end uncounted; nothing else is lost or added
    assert sent - 20 <= counted <= sent <= MAX_REQUESTS, (sent, counted)


def test_the_burst_reaches_vllm_as_concurrent_requests(stack, run):
    span = f"{int(run.ended - run.started) + 5}s"
    peak = requests.get(f"{stack.url('prometheus')}/api/v1/query", timeout=10, params={
        "query": f"max(max_over_time(vllm:num_requests_running[{span}]))"}).json()["data"]["result"]
    assert float(peak[0]["value"][1]) >= BURST_CLIENTS / 3  # vLLM's own gauge, scraped every second


def test_the_outage_pages_vllm_down_alone_and_the_page_resolves(stack, run):
    pages = [e for e in stack.events(receiver="pager", alertname="VLLMDown", status="firing")
             if e["received_at"] >= run.started]
    assert pages and pages[0]["labels"]["instance"] == f"127.0.0.1:{stack.ports['vllm']}"
    eventually(lambda: [e for e in stack.events(receiver="pager", alertname="VLLMDown", status="resolved")
                        if e["received_at"] >= pages[0]["received_at"]], timeout_s=120)
    # the canary's relay lost vLLM too, but at weight 0 its upstream pages nobody
    assert not stack.events(receiver="pager", alertname="GatewayUpstreamDown")
    assert stack.chat(1) == [200]
    supervisor = requests.get(f"{stack.url('supervisor')}/metrics", timeout=5).text
    assert metric_sum(supervisor, "inferwatch_supervisor_restarts_total", child="vllm") == 1


def test_the_slow_canary_is_rolled_back_on_time_to_first_token(stack, run):
    token = (stack.run_dir / "gateway_admin_token").read_text().strip()
    exp = requests.get(f"{stack.url('gateway')}/admin/experiments", timeout=10,
                       headers={"authorization": f"Bearer {token}"}).json()["experiments"][0]
    assert exp["model"] == AB_MODEL and {v["name"]: v["weight"] for v in exp["variants"]} == {"stable": 1.0,
                                                                                             "canary": 0.0}
    # the epoch the demo ramped in, before its rollback opened the current one
    verdict = requests.get(f"{stack.url('drift')}/v1/ab/{AB_MODEL}", timeout=30, params={
        "control": "stable", "treatment": "canary", "epoch": exp["epoch"] - 1, "min_units": 20}).json()
    assert verdict["decision"] == "rollback" and "ttft" in verdict["worse"], verdict
    assert "error_rate" not in verdict["worse"]
    # the gateway's own histograms: the canary's first tokens come the relay's delay later
    text = requests.get(f"{stack.url('gateway')}/metrics", timeout=10).text

    def mean_ttft(variant: str) -> float:
        labels = {"model": AB_MODEL, "variant": variant}
        return (metric_sum(text, "inferwatch_gateway_time_to_first_token_seconds_sum", **labels)
                / metric_sum(text, "inferwatch_gateway_time_to_first_token_seconds_count", **labels))

    assert mean_ttft("canary") - mean_ttft("stable") >= 0.8 * CANARY_DELAY_S


def test_the_long_prompts_drift_from_the_steady_baseline(stack, run):
    baselines = requests.get(f"{stack.url('drift')}/v1/baselines", timeout=10).json()
    assert [b["model"] for b in baselines] == [TINY_MODEL_NAME]
    steady_from = baselines[0]["source"]["from"]
    assert run.started <= steady_from <= run.started + 60  # frozen from the demo's own steady traffic
    seg = requests.get(f"{stack.url('drift')}/v1/drift", params={"model": TINY_MODEL_NAME},
                       timeout=30).json()["segments"][0]
    assert seg["status"] == "drift" and "prompt_tokens" in seg["drifted_features"], seg


def test_previews_over_the_demo(stack, run, tmp_path):
    out_dir = Path(os.environ.get("INFERWATCH_PREVIEW_DIR", tmp_path))
    tr = TimeRange(run.started - 30, run.ended + 30, 1.0)
    for uid, doc in dashboards().items():
        if uid != "inferwatch-gpus":  # no GPU here: the exporter says nvml_up 0
            png = render(doc, stack.url("prometheus"), out_dir / f"{uid}.png", tr)
            assert png.stat().st_size > 20_000, png
