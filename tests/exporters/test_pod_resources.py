"""Which pod uses which GPU, read from a real gRPC server on a unix socket that answers as the
kubelet's pod-resources API does (tests/support/kubelet.py: answers encoded by hand from the
kubelet's proto): pods coming and going, the socket disappearing and coming back, an answer
slower than the timeout, and the NVIDIA device plugin's kinds of device id.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.exporters.pod_resources import PodResources
from inferwatch.exporters.server import Exporter, ExporterSettings, make_server
from tests.support.fleet import fleet
from tests.support.kubelet import Kubelet, allocatable, container, devices, listing, pod
from tests.support.waiting import eventually


@pytest.fixture
def kubelet(tmp_path):
    k = Kubelet(tmp_path / "kubelet.sock").start()
    yield k
    k.stop()


GPU0 = ("0", "GPU-0000", "NVIDIA H100 80GB HBM3", "00000000:01:00.0")
GPU1 = ("1", "GPU-1111", "NVIDIA H100 80GB HBM3", "00000000:02:00.0")
MIG_OF_1 = "MIG-aaaa-bbbb"


def pods_of(watcher: PodResources) -> set[tuple[str, ...]]:
    """(gpu, namespace, pod, container, resource, device, shared) of every pod series."""
    rows = watcher.samples([GPU0, GPU1], {MIG_OF_1: GPU1}).get("inferwatch_gpu_pod_info", [])
    return {(labels[0], *labels[4:]) for labels, value in rows if value == 1}


def health(watcher: PodResources) -> tuple[float | None, dict[str, float]]:
    out = watcher.samples([GPU0, GPU1], {})
    up = out.get("inferwatch_podresources_up", [((), None)])[0][1]
    return up, {labels[0]: v for labels, v in out.get("inferwatch_podresources_errors", [])}


def test_each_kind_of_device_id_finds_its_gpu_and_pods_come_and_go(kubelet):
    kubelet.answer = listing(
        pod("serving", "vllm-a-0", container("vllm", devices("nvidia.com/gpu", "GPU-0000"))),
        # MIG: the device plugin hands out the MIG device's UUID
        pod("serving", "vllm-b-0", container("vllm", devices("nvidia.com/mig-1g.10gb", MIG_OF_1))),
        pod("batch", "job-1", container("main", devices("example.com/fpga", "fpga0")),  # no GPU: left out
            container("sidecar")))
    watcher = PodResources(kubelet.socket, timeout_s=2)
    watcher.poll()
    assert pods_of(watcher) == {
        ("0", "serving", "vllm-a-0", "vllm", "nvidia.com/gpu", "GPU-0000", "false"),
        ("1", "serving", "vllm-b-0", "vllm", "nvidia.com/mig-1g.10gb", MIG_OF_1, "false")}
    assert health(watcher) == (1.0, {})
    # the a-pod replaced by its successor, which the index id strategy names by GPU index
    kubelet.answer = listing(
        pod("serving", "vllm-a-1", container("vllm", devices("nvidia.com/gpu", "0"))),
        pod("serving", "vllm-b-0", container("vllm", devices("nvidia.com/mig-1g.10gb", MIG_OF_1))))
    version = watcher.version
    watcher.poll()
    assert watcher.version > version  # a cached exposition renders again
    assert pods_of(watcher) == {
        ("0", "serving", "vllm-a-1", "vllm", "nvidia.com/gpu", "0", "false"),
        ("1", "serving", "vllm-b-0", "vllm", "nvidia.com/mig-1g.10gb", MIG_OF_1, "false")}
    version = watcher.version
    watcher.poll()  # the same answer: nothing to render again
    assert watcher.version == version
    kubelet.answer = listing()
    watcher.poll()
    assert pods_of(watcher) == set() and health(watcher) == (1.0, {})


def test_pods_sharing_a_time_sliced_gpu_are_each_listed_and_marked_shared(kubelet):
    kubelet.answer = listing(
        pod("serving", "small-a", container("vllm", devices("nvidia.com/gpu", "GPU-1111::0"))),
        pod("serving", "small-b", container("vllm", devices("nvidia.com/gpu", "GPU-1111::3"))),
        pod("serving", "big", container("vllm", devices("nvidia.com/gpu", "GPU-0000"))))
    watcher = PodResources(kubelet.socket)
    watcher.poll()
    assert pods_of(watcher) == {
        ("1", "serving", "small-a", "vllm", "nvidia.com/gpu", "GPU-1111::0", "true"),
        ("1", "serving", "small-b", "vllm", "nvidia.com/gpu", "GPU-1111::3", "true"),
        ("0", "serving", "big", "vllm", "nvidia.com/gpu", "GPU-0000", "false")}


def allocatable_of(watcher: PodResources) -> dict[str, float] | None:
    rows = watcher.samples([GPU0, GPU1], {MIG_OF_1: GPU1}).get("inferwatch_gpu_allocatable")
    return None if rows is None else {labels[0]: value for labels, value in rows}


def test_a_gpu_its_device_plugin_no_longer_offers_is_not_allocatable(kubelet):
    watcher = PodResources(kubelet.socket)
    watcher.poll()
    assert allocatable_of(watcher) is None  # a kubelet without GetAllocatableResources says nothing of it
    assert health(watcher) == (1.0, {})  # and List still works
    kubelet.allocatable = allocatable(devices("nvidia.com/gpu", "GPU-0000"), devices("nvidia.com/mig-1g.10gb", MIG_OF_1))
    watcher.poll()
    assert allocatable_of(watcher) == {"0": 1.0, "1": 1.0}  # GPU 1 through its MIG device
    kubelet.allocatable = allocatable(devices("nvidia.com/gpu", "GPU-0000::0", "GPU-0000::1"))  # time-sliced
    watcher.poll()
    assert allocatable_of(watcher) == {"0": 1.0, "1": 0.0}


def test_without_the_socket_nothing_is_exported_and_nothing_logged(tmp_path, caplog):
    watcher = PodResources(tmp_path / "none.sock")
    with caplog.at_level(logging.DEBUG, logger="inferwatch.exporters.pod_resources"):
        watcher.poll()
        watcher.poll()
    assert watcher.samples([GPU0], {}) == {}
    assert caplog.records == []


def test_the_socket_gone_and_back_keeps_the_last_pods_then_takes_the_new_ones(kubelet, caplog):
    kubelet.answer = listing(pod("serving", "vllm-a-0", container("vllm", devices("nvidia.com/gpu", "GPU-0000"))))
    watcher = PodResources(kubelet.socket, timeout_s=1)
    watcher.poll()
    kubelet.stop()  # the kubelet restarts: its socket file goes, then comes back
    with caplog.at_level(logging.WARNING, logger="inferwatch.exporters.pod_resources"):
        watcher.poll()
        watcher.poll()
    assert health(watcher) == (0.0, {"socket_missing": 2.0})
    assert pods_of(watcher) == {("0", "serving", "vllm-a-0", "vllm", "nvidia.com/gpu", "GPU-0000", "false")}
    assert len(caplog.records) == 1, "logged when it starts failing, not every poll"
    kubelet.answer = listing(pod("serving", "vllm-a-1", container("vllm", devices("nvidia.com/gpu", "GPU-0000"))))
    kubelet.start()
    watcher.poll()
    assert health(watcher) == (1.0, {"socket_missing": 2.0})
    assert pods_of(watcher) == {("0", "serving", "vllm-a-1", "vllm", "nvidia.com/gpu", "GPU-0000", "false")}


def test_a_socket_that_answers_nothing_is_unavailable_not_a_crash(tmp_path):
    (tmp_path / "kubelet.sock").touch()  # a stale file: nothing listens
    watcher = PodResources(tmp_path / "kubelet.sock", timeout_s=0.5)
    watcher.poll()
    assert health(watcher) == (0.0, {"unavailable": 1.0})
    assert pods_of(watcher) == set()


def test_an_answer_slower_than_the_timeout_fails_in_the_timeout_and_keeps_the_last_pods(kubelet):
    kubelet.answer = listing(pod("serving", "vllm-a-0", container("vllm", devices("nvidia.com/gpu", "GPU-0000"))))
    watcher = PodResources(kubelet.socket, timeout_s=1.0)
    watcher.poll()
    kubelet.delay_s = 6.0
    started = time.monotonic()
    watcher.poll()
    assert time.monotonic() - started < 3.0, "the poll waits the timeout, not the answer"
    assert health(watcher) == (0.0, {"deadline_exceeded": 1.0})
    assert pods_of(watcher) == {("0", "serving", "vllm-a-0", "vllm", "nvidia.com/gpu", "GPU-0000", "false")}
    kubelet.delay_s = 0.0
    watcher.poll()
    assert health(watcher) == (1.0, {"deadline_exceeded": 1.0})


def test_the_exporter_serves_pods_of_its_gpus_and_a_slow_kubelet_never_slows_a_scrape(kubelet):
    nvml = fleet(2)
    exporter = Exporter(ExporterSettings(port=0, interval_s=0.05, pod_resources_socket=kubelet.socket,
                                         pod_resources_interval_s=0.1, pod_resources_timeout_s=5), nvml)
    exporter.start()
    server = make_server(exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"

    def scrape() -> tuple[float, dict[str, list]]:
        started = time.monotonic()
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read().decode()
        families = {f.name: f.samples for f in text_string_to_metric_families(body)}
        return time.monotonic() - started, families

    try:
        uuids = {s.labels["gpu"]: s.labels["uuid"] for s in scrape()[1]["inferwatch_gpu_info"]}
        kubelet.answer = listing(pod("serving", "vllm-0", container("vllm", devices("nvidia.com/gpu", uuids["1"]))))
        (row,) = eventually(lambda: scrape()[1].get("inferwatch_gpu_pod_info"), timeout_s=5)
        assert (row.labels["gpu"], row.labels["uuid"], row.labels["pod"], row.labels["namespace"]) == \
               ("1", uuids["1"], "vllm-0", "serving")
        kubelet.delay_s = 4.0  # the watcher's next List waits on it
        calls = kubelet.calls
        eventually(lambda: kubelet.calls > calls, timeout_s=5)
        took = max(scrape()[0] for _ in range(5))
        assert took < 1.0, f"a scrape took {took:.2f}s while the kubelet took 4 s to answer"
    finally:
        kubelet.delay_s = 0.0
        server.shutdown()
        server.server_close()
        exporter.stop()
