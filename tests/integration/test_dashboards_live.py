"""Every dashboard query against a live stack: real vLLM under generated traffic, the
gateway, the drift service with a baseline and a shift, the exporter on a fake 4-GPU node
(with processes and an XID), real Prometheus scraping them every second with the shipped
rules (group intervals capped at 5 s, the test override, so day and period SLO windows
have data). Every variable query and every panel query, substituted as Grafana would over
the dashboard's default time range, must parse and return data. The same run draws the
PNG previews.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest
import requests

from inferwatch.alerts.generate import cap_interval, rule_files, write
from inferwatch.alerts.spec import JOB_DRIFT, JOB_EXPORTER, JOB_GATEWAY, JOB_VLLM
from inferwatch.dashboards.generate import dashboards
from inferwatch.dashboards.preview import render
from inferwatch.dashboards.queries import TimeRange, panel_results, resolve_variables, substitute
from inferwatch.drift.service.app import DriftSettings, create_app as drift_app
from inferwatch.exporters.server import Exporter, ExporterSettings, make_server
from inferwatch.serving.admission import key_id
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.tiny_model import ADAPTER_NAME
from tests.conftest import TINY_MODEL_NAME
from tests.support.feature_records import body, records
from tests.support.fleet import FakeProcess, fleet
from tests.support.kubelet import Kubelet, container, devices, listing, pod
from tests.support.prometheus_server import instant_query, running_prometheus
from tests.support.redis_server import RedisServer
from tests.support.servers import AppServer, GatewayServer
from tests.support.sockets import free_port
from tests.support.waiting import eventually

AB_MODEL = "tiny-ab"  # the model clients ask for that the live experiment splits
# two tenants, and requests without a key (anonymous: the experiment's, whose units must be
# many for its verdict); one tenant's budget runs out on the way, so the budget and refusal
# panels have something to show; some of the tenants' requests go to the LoRA adapter
TENANT_KEYS = ("sk-live-search", "sk-live-batch")

pytestmark = pytest.mark.vllm
DOCS = dashboards()
SCRAPE_S = 1.0


@pytest.fixture(scope="module")
def prometheus(vllm_server, otlp_receiver, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dash-live")
    nvml = fleet(4)
    for dev in nvml.devices:
        dev.processes = [FakeProcess(pid=4242, used_memory=2 * 2**30)]
    # the node's kubelet: one pod holds GPUs 0 and 1, two share GPU 2 (time-slicing)
    kubelet = Kubelet(tmp / "kubelet.sock").start()
    nvml.nvmlInit()
    uuid = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(3)]
    nvml.nvmlShutdown()
    kubelet.answer = listing(
        pod("serving", "vllm-0", container("vllm", devices("nvidia.com/gpu", uuid[0], uuid[1]))),
        *(pod("batch", f"small-{k}", container("vllm", devices("nvidia.com/gpu", f"{uuid[2]}::{k}"))) for k in (0, 1)))
    exporter = Exporter(ExporterSettings(port=free_port(), interval_s=0.5, slow_interval_s=1, processes=True,
                                         pod_resources_socket=kubelet.socket, pod_resources_interval_s=1), nvml)
    exporter.start()
    exporter_http = make_server(exporter)
    import threading
    threading.Thread(target=exporter_http.serve_forever, daemon=True).start()
    # an experiment (no traffic needed: each replica exports the weights it routes by) and a
    # Redis the gateway shares its state through, for the replicas row
    experiments = tmp / "experiments.yaml"
    experiments.write_text(f"""
experiments:
  {AB_MODEL}:
    name: live
    variants:
      - {{name: v1, upstream_url: "{vllm_server.url}", model: {TINY_MODEL_NAME}, weight: 0.5}}
      - {{name: v2, upstream_url: "{vllm_server.url}", model: {TINY_MODEL_NAME}, weight: 0.5}}
""")
    limits = tmp / "limits.yaml"
    limits.write_text(f"""
tenants:
  search: {{keys: [{key_id(TENANT_KEYS[0])}], critical: true, budget: {{tokens: 100000000, period: day}}}}
  batch: {{keys: [{key_id(TENANT_KEYS[1])}], budget: {{tokens: 600, period: month}}}}
""")
    with RedisServer(tmp / "redis") as redis, AppServer(drift_app(DriftSettings(db_path=":memory:"))) as drift, \
            GatewayServer(GatewaySettings(upstream_url=vllm_server.url, drift_url=drift.url, feature_flush_s=0.2,
                                          capture_logprobs=True, otlp_endpoint=otlp_receiver.endpoint,
                                          experiment_file=experiments, redis_url=redis.url, limits_file=limits,
                                          api_keys=list(TENANT_KEYS), allow_anonymous=True)) as gateway:
        rules = tmp / "rules"
        write(cap_interval(rule_files(), "5s"), rules)
        target = lambda url: url.removeprefix("http://")  # noqa: E731
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S:g}s", "evaluation_interval": "1s"},
            "rule_files": [str(f) for f in sorted(rules.glob("*.yml"))],
            "scrape_configs": [
                {"job_name": JOB_GATEWAY, "static_configs": [{"targets": [target(gateway.url)]}]},
                {"job_name": JOB_VLLM, "static_configs": [{"targets": [target(vllm_server.url)],
                                                           "labels": {"model": TINY_MODEL_NAME}}]},
                {"job_name": JOB_DRIFT, "static_configs": [{"targets": [target(drift.url)]}]},
                {"job_name": JOB_EXPORTER,
                 "static_configs": [{"targets": [f"127.0.0.1:{exporter_http.server_address[1]}"]}]},
            ]}
        try:
            with running_prometheus(config, tmp, "--enable-feature=exemplar-storage") as url:
                _drive(gateway.url, drift.url, nvml)
                # the 5-second SLO groups and the drift verdicts have run a few times
                eventually(lambda: instant_query(url, "inferwatch_slo:period_error_budget_remaining:ratio"),
                           timeout_s=60)
                eventually(lambda: instant_query(url, "inferwatch_ab_decision"), timeout_s=30)  # a scrape since
                yield url
        finally:
            exporter_http.shutdown()
            exporter.stop()
            kubelet.stop()


def _drive(gateway: str, drift: str, nvml) -> None:
    """Traffic of every kind the dashboards show, for about 20 s."""
    now = time.time()
    reference = records(300, now - 7200, now - 5400, seed=1, model=TINY_MODEL_NAME, variant="default")
    requests.post(f"{drift}/v1/ingest", data=body(reference), timeout=10).raise_for_status()
    requests.post(f"{drift}/v1/baselines", json={"model": TINY_MODEL_NAME, "variant": "default",
                                                 "from": now - 7200, "to": now - 5400}, timeout=10).raise_for_status()
    shifted = records(300, now - 60, now, seed=2, model=TINY_MODEL_NAME, variant="default", prompt_mu=7.0)
    requests.post(f"{drift}/v1/ingest", data=body(shifted), timeout=10).raise_for_status()
    nvml.emit_xid(0, 79)
    deadline = time.monotonic() + 20
    i = 0
    while time.monotonic() < deadline:
        i += 1
        for k, dev in enumerate(nvml.devices):  # the GPUs work with the traffic: busy, drawing power
            busy = 0.5 + 0.4 * math.sin((deadline - time.monotonic()) / 3 + k)
            dev.gpu_util, dev.power_mw = round(100 * busy), round(100_000 + 500_000 * busy)
        model = AB_MODEL if i % 3 == 0 else ADAPTER_NAME if i % 4 == 1 else TINY_MODEL_NAME
        auth = {} if model == AB_MODEL else {"authorization": f"Bearer {TENANT_KEYS[i % 2]}"}
        requests.post(f"{gateway}/v1/chat/completions", timeout=30, headers=auth, json={
            "model": model, "max_tokens": 8 + i % 24, "stream": i % 2 == 0,
            "messages": [{"role": "user", "content": "hello " * (1 + i % 7)}]})
        if i % 10 == 0:  # a refused request, so rejected-request panels have a real series too
            requests.post(f"{gateway}/v1/chat/completions", data=b"{not json", timeout=10)
    # the A/B verdict panels show the experiments the drift service watches: judging one watches
    # it (200 or 412 by its decision; 404 until the gateway's records of the experiment arrive),
    # and 10 units an arm (of ~20 s of traffic) let its guardrails be judged. Each probe sends
    # one more request of the experiment, and a failure says what the drift service answered.
    answers: list[str] = []

    def judged() -> bool:
        requests.post(f"{gateway}/v1/chat/completions", timeout=30, json={
            "model": AB_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]})
        r = requests.get(f"{drift}/v1/ab/{AB_MODEL}", params={"control": "v1", "treatment": "v2", "min_units": 10},
                         timeout=30)
        answers.append(f"{r.status_code} {r.text[:500]}")
        return r.status_code in (200, 412)
    try:
        eventually(judged, timeout_s=45, interval_s=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nthe drift service last answered: {answers[-1:]}") from None


# Series one panel may draw at the dashboard's defaults ("All") before it needs a repeat or a
# variable to narrow it: past that, lines and legend entries stop being told apart.
MAX_SERIES = 8
# Panels that cannot have data in this stack, and why. Keep this short.
NO_DATA_HERE: dict[str, str] = {}


@pytest.mark.parametrize("uid", sorted(DOCS))
def test_every_variable_and_panel_query_returns_data(prometheus, uid):
    doc = DOCS[uid]
    now = time.time()
    tr = TimeRange(now - 3600, now, SCRAPE_S)
    variables = resolve_variables(prometheus, doc, tr, strict=True)  # every variable has values here
    empty, crowded = [], []
    for panel in doc["panels"]:
        if panel["type"] == "row":
            continue
        drawn = 0
        for target, series in zip(panel["targets"], panel_results(prometheus, panel, variables, tr)):
            has_data = any(s["values"] for s in series)
            drawn += len(series)
            if not has_data and panel["title"] not in NO_DATA_HERE:
                empty.append(f'{panel["title"]}: {substitute(target["expr"], variables, tr)}')
        # a repeated panel's copies each draw one value's share, a heatmap's series are its buckets;
        # the rest must stay readable
        if drawn > MAX_SERIES and not panel.get("repeat") and panel["type"] != "heatmap":
            crowded.append(f'{panel["title"]}: {drawn} series')
    assert not empty, "panels without data:\n" + "\n".join(empty)
    assert not crowded, f"panels with more than {MAX_SERIES} series at the default variables:\n" + "\n".join(crowded)


def test_exemplar_panels_find_trace_ids(prometheus):
    """Latency panels that ask for exemplars get trace ids for them from Prometheus."""
    doc = DOCS["inferwatch-serving"]
    now = time.time()
    tr = TimeRange(now - 3600, now, SCRAPE_S)
    variables = resolve_variables(prometheus, doc, tr, strict=True)
    targets = [(p["title"], t) for p in doc["panels"] if p["type"] != "row" for t in p["targets"] if t.get("exemplar")]
    assert targets
    for title, target in targets:
        resp = requests.get(f"{prometheus}/api/v1/query_exemplars", timeout=30, params={
            "query": substitute(target["expr"], variables, tr), "start": tr.start, "end": tr.end})
        exemplars = [e for series in resp.json()["data"] for e in series["exemplars"]]
        assert exemplars and all(len(e["labels"]["trace_id"]) == 32 for e in exemplars), title


def test_previews_render_from_the_live_prometheus(prometheus, tmp_path):
    out_dir = Path(os.environ.get("INFERWATCH_PREVIEW_DIR", tmp_path))
    now = time.time()
    tr = TimeRange(now - 45, now, SCRAPE_S)  # about the span of the traffic
    for uid, doc in DOCS.items():
        png = render(doc, prometheus, out_dir / f"{uid}.png", tr)
        assert png.stat().st_size > 20_000, png
