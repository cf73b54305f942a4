"""The manifests' scrape objects run by a real Prometheus, as the Prometheus Operator would
write them (tests/deploy/operator_config.py), against the real servers: the session's vLLM,
a gateway, a drift service and the exporter (fake NVML). Their job names must be the ones
the rules select, vLLM's series must carry ``model`` (``up`` included), the absent()
guards must stay silent, and the KEDA query must read the one gauge it scales on.
"""

from __future__ import annotations

import threading

import pytest
import requests

from inferwatch.alerts import spec
from inferwatch.deploy.kube import autoscaling
from inferwatch.deploy.kube.settings import DEFAULT as KUBE, NAMESPACE
from inferwatch.drift.service.app import DriftSettings, create_app as drift_app
from inferwatch.exporters.server import Exporter, ExporterSettings, make_server
from inferwatch.serving.settings import GatewaySettings
from tests.conftest import TINY_MODEL_NAME
from tests.deploy.operator_config import discovered, pod_monitor_job, service_monitor_job
from tests.deploy.test_kubernetes import built
from tests.support import kubelet as node
from tests.support.fleet import fleet
from tests.support.prometheus_server import instant_query, running_prometheus
from tests.support.servers import AppServer, GatewayServer
from tests.support.sockets import free_port
from tests.support.waiting import eventually

OVERLAYS = KUBE.overlays

pytestmark = pytest.mark.vllm
MODEL = OVERLAYS["cpu-demo"]


def _one(objects, kind: str, name: str) -> dict:
    [obj] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


@pytest.fixture(scope="module")
def prometheus(vllm_server, tmp_path_factory):
    assert MODEL.name == TINY_MODEL_NAME  # the overlay's model is the one the suite's vLLM serves
    tmp = tmp_path_factory.mktemp("operator-scrape")
    objects = built("cpu-demo")
    pod = {name: _one(objects, kind, name)["spec"]["template"] for kind, name in (
        ("Deployment", "inferwatch-gateway"), ("StatefulSet", "inferwatch-drift"), ("DaemonSet", "inferwatch-exporter"),
        ("Deployment", MODEL.service))}
    nvml = fleet(2)
    # the node's kubelet: a vLLM pod holds GPU 1 (its UUID read from the fake, as the device plugin does)
    kubelet = node.Kubelet(tmp / "kubelet.sock").start()
    nvml.nvmlInit()
    kubelet.answer = node.listing(node.pod("serving", "vllm-0", node.container("vllm", node.devices(
        "nvidia.com/gpu", nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(1))))))
    nvml.nvmlShutdown()
    exporter = Exporter(ExporterSettings(port=free_port(), interval_s=0.5, slow_interval_s=1,
                                         pod_resources_socket=kubelet.socket, pod_resources_interval_s=0.5), nvml)
    exporter.start()
    exporter_http = make_server(exporter)
    threading.Thread(target=exporter_http.serve_forever, daemon=True).start()
    with AppServer(drift_app(DriftSettings(db_path=":memory:"))) as drift, \
            GatewayServer(GatewaySettings(upstream_url=vllm_server.url)) as gateway:
        address = {"inferwatch-gateway": gateway.url, "inferwatch-drift": drift.url, MODEL.service: vllm_server.url}
        jobs = []
        for monitor in (o for o in objects if o["kind"] == "ServiceMonitor"):
            targets = [discovered(address[svc["metadata"]["name"]].removeprefix("http://"), NAMESPACE,
                                  pod[svc["metadata"]["name"]], svc["metadata"]["name"], "http", svc)
                       for svc in (o for o in objects if o["kind"] == "Service")
                       if svc["metadata"]["name"] in address]  # every Service: the selector picks its own
            jobs.append(service_monitor_job(monitor, NAMESPACE, targets))
        [pod_monitor] = [o for o in objects if o["kind"] == "PodMonitor"]
        jobs.append(pod_monitor_job(pod_monitor, NAMESPACE, [discovered(
            f"127.0.0.1:{exporter_http.server_address[1]}", NAMESPACE, pod["inferwatch-exporter"], "exporter",
            "metrics")]))
        config = {"global": {"scrape_interval": "1s"},
                  "scrape_configs": [{**job, "scrape_interval": "1s"} for job in jobs]}
        try:
            with running_prometheus(config, tmp) as url:
                requests.post(f"{gateway.url}/v1/completions", timeout=60, json={
                    "model": TINY_MODEL_NAME, "prompt": "one two", "max_tokens": 2})
                eventually(lambda: len(instant_query(url, "up == 1")) == 4, timeout_s=30)
                yield url
        finally:
            exporter_http.shutdown()
            exporter.stop()
            kubelet.stop()


def test_each_monitor_scrapes_its_own_service_under_the_rules_job_name(prometheus):
    up = {r["metric"]["job"]: r["metric"] for r in instant_query(prometheus, "up")}
    assert set(up) == {spec.JOB_GATEWAY, spec.JOB_DRIFT, spec.JOB_VLLM, spec.JOB_EXPORTER}, up
    assert all(labels["namespace"] == NAMESPACE for labels in up.values())
    assert up[spec.JOB_VLLM]["model"] == TINY_MODEL_NAME  # VLLMDown names the model
    assert up[spec.JOB_VLLM]["service"] == MODEL.service


def test_the_pod_holding_a_gpu_keeps_its_labels_through_the_pod_monitor(prometheus):
    """honorLabels: the pod, namespace and container the kubelet names stay on the pod series,
    where the scrape's own (the exporter's pod) would have renamed them exported_*."""
    [row] = eventually(lambda: instant_query(prometheus, "inferwatch_gpu_pod_info"), timeout_s=30)
    labels = row["metric"]
    assert (labels["gpu"], labels["pod"], labels["namespace"], labels["container"]) == \
           ("1", "vllm-0", "serving", "vllm")
    assert not any(k.startswith("exported_") for k in labels)
    [info] = instant_query(prometheus, 'inferwatch_gpu_info{gpu="1"}')
    assert info["metric"]["pod"] != "vllm-0"  # the GPU's own series carry the scrape's pod: the exporter's


def test_vllm_series_carry_model_and_the_keda_query_reads_one_gauge(prometheus):
    eventually(lambda: instant_query(prometheus, f'vllm:generation_tokens_total{{model="{TINY_MODEL_NAME}"}}'),
               timeout_s=30)
    [sample] = instant_query(prometheus, autoscaling.waiting_query(MODEL, KUBE.namespace))
    assert float(sample["value"][1]) == 0.0


def test_the_absent_guards_are_silent_when_every_job_is_scraped(prometheus):
    groups = _one(built("cpu-demo"), "PrometheusRule", "inferwatch")["spec"]["groups"]
    [absent] = [g for g in groups if g["name"] == "inferwatch-absent"]
    guarded = [rule for rule in absent["rules"] if rule["labels"]["metric"] == "up"]
    assert len(guarded) == 4
    for rule in guarded:
        assert instant_query(prometheus, rule["expr"]) == [], rule["alert"]  # a job name off by a letter fires it


def test_an_exporter_monitor_that_selects_no_pod_keeps_its_absent_guard_silent(tmp_path):
    """A cluster without GPU nodes runs no exporter pod; the PodMonitor's discovery still
    finds the namespace's other pods, and relabelling keeps none. The guard must read that
    as "configured with no targets", and still fire where the job is missing altogether."""
    objects = built("cpu-demo")
    [pod_monitor] = [o for o in objects if o["kind"] == "PodMonitor"]
    gateway_pod = _one(objects, "Deployment", "inferwatch-gateway")["spec"]["template"]
    [guard] = [r["expr"] for g in _one(objects, "PrometheusRule", "inferwatch")["spec"]["groups"]
               for r in g["rules"] if r.get("alert") == "InferwatchTargetAbsent"
               and r["labels"]["job"] == spec.JOB_EXPORTER]
    prometheus_port = free_port()
    self_scrape = {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{prometheus_port}"]}]}
    no_pod = pod_monitor_job(pod_monitor, NAMESPACE, [discovered(
        f"127.0.0.1:{free_port()}", NAMESPACE, gateway_pod, "gateway", "http")])

    def guard_result(jobs: list[dict], tmp) -> list[dict]:
        config = {"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}
        with running_prometheus(config, tmp, port=prometheus_port) as url:
            eventually(lambda: instant_query(url, 'prometheus_target_scrape_pool_targets{scrape_job="prometheus"}'),
                       timeout_s=30)
            return instant_query(url, guard)

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert guard_result([self_scrape, no_pod], tmp_path / "a") == []
    assert len(guard_result([self_scrape], tmp_path / "b")) == 1  # the job missing: the ticket stands
