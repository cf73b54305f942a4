"""The exporter over fake GPUs with known readings: values, types, units, labels, errors."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.exporters.collector import CachedExposition, SnapshotStore
from inferwatch.exporters.metrics import GPU_LABELS, SPECS
from inferwatch.exporters.sampler import Sampler
from inferwatch.exporters.server import Exporter, ExporterSettings, make_server
from inferwatch.exporters.xid import XidWatcher
from tests.exporters.driver import kernel_gpus
from tests.support.clock import Clock
from tests.support.fleet import FakeMig, FakeProcess, fleet, h100


def scrape(nvml, **sampler_kwargs) -> tuple[dict, str]:
    sampler = Sampler(nvml, **sampler_kwargs)
    sampler.start()
    exposition = CachedExposition(SnapshotStore(sampler.sample()))
    text = exposition.render().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def value(families, name, gpu="0", **labels):
    family = families[name]
    rows = [s for s in family.samples if s.labels.get("gpu") == gpu and all(s.labels[k] == v for k, v in labels.items())]
    assert len(rows) == 1, (name, gpu, labels, family.samples)
    return rows[0].value


def test_every_reading_in_base_units():
    families, _ = scrape(fleet(2))
    g1 = h100(1)
    expected = {
        "inferwatch_gpu_utilization_ratio": 0.41,
        "inferwatch_gpu_memory_utilization_ratio": 0.11,
        "inferwatch_gpu_memory_used_bytes": g1.memory_used,
        "inferwatch_gpu_memory_free_bytes": g1.memory_total - g1.memory_used - g1.memory_reserved,
        "inferwatch_gpu_memory_reserved_bytes": 512 * 2**20,
        "inferwatch_gpu_memory_total_bytes": g1.memory_total,
        "inferwatch_gpu_temperature_celsius": 51,
        "inferwatch_gpu_memory_temperature_celsius": 61,
        "inferwatch_gpu_power_watts": 251.0,
        "inferwatch_gpu_power_limit_watts": 700.0,
        "inferwatch_gpu_sm_clock_hertz": 1755e6,
        "inferwatch_gpu_memory_clock_hertz": 2619e6,
        "inferwatch_gpu_sm_clock_max_hertz": 1980e6,
        "inferwatch_gpu_memory_clock_max_hertz": 2619e6,
        "inferwatch_gpu_performance_state": 0,
        "inferwatch_gpu_pcie_tx_bytes_per_second": 200 * 1024,
        "inferwatch_gpu_pcie_rx_bytes_per_second": 400 * 1024,
        "inferwatch_gpu_pcie_replays": 1,
        "inferwatch_gpu_retired_pages_pending": 0,
        "inferwatch_gpu_row_remap_pending": 1,
        "inferwatch_gpu_row_remap_failure": 0,
        "inferwatch_gpu_encoder_utilization_ratio": 0.0,
        "inferwatch_gpu_decoder_utilization_ratio": 0.07,
        "inferwatch_gpu_device_failed": 0,
        "inferwatch_gpu_info": 1,
    }
    # the energy counter moves at the power's rate from its first read, which a scrape makes
    assert value(families, "inferwatch_gpu_energy_joules", gpu="1") == pytest.approx(2000.0, abs=251 * 2)
    assert families["inferwatch_gpu_energy_joules"].samples[0].name == "inferwatch_gpu_energy_joules_total"
    for name, want in expected.items():
        suffix = "_total" if name.endswith(("_joules", "_replays")) else ""
        assert value(families, name, gpu="1") == pytest.approx(want), name
        assert families[name].samples[0].name == name + suffix
    for link in ("0", "1"):
        assert value(families, "inferwatch_gpu_nvlink_tx_bytes", gpu="1", link=link) == 20 * 1024
        assert value(families, "inferwatch_gpu_nvlink_rx_bytes", gpu="1", link=link) == 40 * 1024
        assert value(families, "inferwatch_gpu_nvlink_errors", gpu="1", link=link, type="crc_flit") == 3
        assert value(families, "inferwatch_gpu_nvlink_errors", gpu="1", link=link, type="replay") == 1
        assert value(families, "inferwatch_gpu_nvlink_errors", gpu="1", link=link, type="crc_data") == 0
    assert value(families, "inferwatch_gpu_ecc_errors", gpu="1", type="corrected", scope="volatile") == 5
    assert value(families, "inferwatch_gpu_ecc_errors", gpu="1", type="uncorrected", scope="aggregate") == 2
    assert value(families, "inferwatch_gpu_ecc_errors", gpu="1", type="uncorrected", scope="volatile") == 0
    assert value(families, "inferwatch_gpu_remapped_rows", gpu="1", type="correctable") == 1
    assert value(families, "inferwatch_gpu_retired_pages", gpu="1", cause="double_bit") == 0
    throttles = {s.labels["reason"]: s.value for s in families["inferwatch_gpu_throttle_active"].samples
                 if s.labels["gpu"] == "1"}
    assert throttles["sw_power_cap"] == 1 and throttles["hw_thermal_slowdown"] == 1
    assert sum(throttles.values()) == 2 and len(throttles) == 11
    assert "inferwatch_gpu_fan_speed_ratio" not in families  # NotSupported: absent, not zero
    assert value(families, "inferwatch_nvml_up", gpu=None) == 1
    assert value(families, "inferwatch_nvml_devices", gpu=None) == 2
    info = families["inferwatch_nvml_info"].samples[0].labels
    assert info == {"driver_version": "550.54.15", "cuda_version": "12.4"}


def test_types_help_and_labels_follow_the_declarations():
    families, _ = scrape(fleet(2))
    specs = {s.name: s for s in SPECS}
    for name, family in families.items():
        if name == "inferwatch_nvml_snapshot_age_seconds":
            continue
        spec = specs[name]
        assert family.type == spec.kind, name
        assert family.documentation == spec.doc
        for sample in family.samples:
            assert set(sample.labels) == set(spec.label_names), name
    gpu0 = families["inferwatch_gpu_info"].samples[0].labels
    assert {k: gpu0[k] for k in GPU_LABELS} == {"gpu": "0", "uuid": "GPU-00000000-aaaa-bbbb-cccc-000000000000",
                                                  "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:01:00.0"}


def test_promtool_accepts_the_exposition():
    _, text = scrape(fleet(3, ))
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0 and lint.stdout + lint.stderr == "", lint.stdout + lint.stderr


def test_mig_instances_and_processes():
    nvml = fleet(1)
    nvml.devices[0].mig = [FakeMig(1, 0, "MIG-a", 10 * 2**30, 2**30), FakeMig(2, 0, "MIG-b", 20 * 2**30, 0)]
    nvml.devices[0].processes = [FakeProcess(os.getpid(), 3 * 2**30), FakeProcess(999_999_999, None)]
    families, _ = scrape(nvml, processes=True)
    assert value(families, "inferwatch_gpu_mig_enabled") == 1
    assert value(families, "inferwatch_gpu_mig_memory_total_bytes", mig_uuid="MIG-b", gpu_instance="2") == 20 * 2**30
    assert value(families, "inferwatch_gpu_mig_memory_used_bytes", mig_uuid="MIG-a", compute_instance="0") == 2**30
    procs = families["inferwatch_gpu_process_memory_used_bytes"].samples
    assert [(s.labels["pid"], s.value) for s in procs] == [(str(os.getpid()), 3 * 2**30)]  # unknown memory left out
    with open(f"/proc/{os.getpid()}/comm") as f:
        assert procs[0].labels["process"] == f.read().strip()


def test_processes_are_opt_in_and_sampled_on_the_slow_interval():
    nvml = fleet(1)
    nvml.devices[0].processes = [FakeProcess(1, 2**30)]
    families, _ = scrape(nvml)
    assert "inferwatch_gpu_process_memory_used_bytes" not in families

    sampler = Sampler(nvml, processes=True, slow_interval_s=3600)
    sampler.start()
    first = sampler.sample()
    nvml.devices[0].processes = [FakeProcess(1, 5 * 2**30)]
    again = sampler.sample()  # within the slow interval: the process list is reused, not re-read
    assert again.samples["inferwatch_gpu_process_memory_used_bytes"] == first.samples[
        "inferwatch_gpu_process_memory_used_bytes"]


def test_not_supported_queries_are_skipped_quietly_and_not_asked_again(caplog):
    clock = Clock()
    nvml = fleet(1, clock=clock)
    nvml.devices[0].unsupported = {"nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetEncoderUtilization"}
    sampler = Sampler(nvml, monotonic=clock)
    sampler.start()
    with caplog.at_level(logging.DEBUG):
        before = nvml.calls
        sampler.sample()
        calls_first = nvml.calls - before
        clock.now += 1
        sampler.sample()
        calls_second = nvml.calls - before - calls_first
    # fan, replay, encoder, MIG mode: asked once, never again; GPM's second cycle reads metrics
    # between two samples where its first only took a sample
    assert calls_second == calls_first - 4 + 1
    families = {f.name: f for f in text_string_to_metric_families(
        CachedExposition(SnapshotStore(sampler.sample())).render().decode())}
    assert "inferwatch_gpu_pcie_replays" not in families and "inferwatch_gpu_encoder_utilization_ratio" not in families
    assert not families["inferwatch_gpu_collection_errors"].samples
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_one_gpu_lost_mid_run_leaves_the_others_exported():
    nvml = fleet(3)
    sampler = Sampler(nvml)
    sampler.start()
    store = SnapshotStore(sampler.sample())
    exposition = CachedExposition(store)
    nvml.fail("nvmlDeviceGetPowerUsage", 1, pynvml.NVML_ERROR_GPU_IS_LOST)
    nvml.fail("nvmlDeviceGetMemoryInfo", 2, pynvml.NVML_ERROR_UNKNOWN, times=1)
    store.publish(sampler.sample())
    families = {f.name: f for f in text_string_to_metric_families(exposition.render().decode())}
    assert value(families, "inferwatch_gpu_device_failed", gpu="0") == 0
    assert value(families, "inferwatch_gpu_device_failed", gpu="1") == 1
    assert value(families, "inferwatch_gpu_device_failed", gpu="2") == 1
    assert value(families, "inferwatch_gpu_power_watts", gpu="0") == 250.0
    assert not [s for s in families["inferwatch_gpu_power_watts"].samples if s.labels["gpu"] == "1"]
    assert value(families, "inferwatch_gpu_collection_errors", gpu="1", query="nvmlDeviceGetPowerUsage") == 1
    assert value(families, "inferwatch_gpu_collection_errors", gpu="2", query="nvmlDeviceGetMemoryInfo") == 1
    assert value(families, "inferwatch_nvml_up", gpu=None) == 1

    store.publish(sampler.sample())  # GPU 2's error was transient; GPU 1 stays lost
    families = {f.name: f for f in text_string_to_metric_families(exposition.render().decode())}
    assert value(families, "inferwatch_gpu_device_failed", gpu="2") == 0
    assert value(families, "inferwatch_gpu_device_failed", gpu="1") == 1
    assert value(families, "inferwatch_gpu_collection_errors", gpu="1", query="nvmlDeviceGetPowerUsage") == 2


def test_real_nvml_serves_up_zero_and_says_why_without_a_driver_and_the_gpus_with_one(caplog):
    """The real nvidia-ml-py: on a host without the driver (this one) nvmlInit fails and the
    exporter does not; on a GPU host it exports every GPU the kernel driver has bound."""
    gpus = kernel_gpus()
    exporter = Exporter(ExporterSettings(port=0), pynvml)
    with caplog.at_level(logging.ERROR):
        exporter.start()
    try:
        families = {f.name: f for f in text_string_to_metric_families(exporter.exposition.render().decode())}
        assert families["inferwatch_nvml_up"].samples[0].value == (1 if gpus else 0)
        assert families["inferwatch_nvml_devices"].samples[0].value == (gpus or 0)
        if gpus is None:
            assert any("NVML unavailable" in r.getMessage() for r in caplog.records)
        else:
            failed = [s.value for s in families["inferwatch_gpu_device_failed"].samples]
            assert failed == [0.0] * gpus
    finally:
        exporter.stop()


def test_exporter_recovers_when_nvml_appears_later():
    """Driver not loaded when the exporter starts (node boot order): it retries on its own."""
    nvml = fleet(2, library_missing=True)
    exporter = Exporter(ExporterSettings(port=0, interval_s=0.02, retry_s=0.1), nvml)
    exporter.start()
    try:
        assert b"inferwatch_nvml_up 0.0" in exporter.exposition.render()
        nvml.library_missing = False
        deadline = time.monotonic() + 10
        while b"inferwatch_nvml_up 1.0" not in exporter.exposition.render() and time.monotonic() < deadline:
            time.sleep(0.02)
        families = {f.name: f for f in text_string_to_metric_families(exporter.exposition.render().decode())}
        assert families["inferwatch_nvml_up"].samples[0].value == 1
        assert families["inferwatch_nvml_devices"].samples[0].value == 2
        nvml.emit_xid(1, 79)  # the XID watcher started with it
        deadline = time.monotonic() + 5
        while b'xid="79"' not in exporter.exposition.render() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b'xid="79"' in exporter.exposition.render()
    finally:
        exporter.stop()


def test_xid_events_counted_while_scraping_concurrently():
    nvml = fleet(2)
    sampler = Sampler(nvml)
    sampler.start()
    devices = sampler.devices
    xid = XidWatcher(nvml, {d.index: d.handle for d in devices}, {d.index: d.labels for d in devices},
                     wait_ms=50)
    assert xid.start()
    store = SnapshotStore(sampler.sample())
    exposition = CachedExposition(store, xid)
    stop = threading.Event()
    scrapes = []

    def scraper():
        while not stop.is_set():
            scrapes.append(exposition.render())

    threads = [threading.Thread(target=scraper) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(300):
        nvml.emit_xid(i % 2, 79 if i % 3 else 48)
    deadline = time.monotonic() + 10
    while xid.version < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    xid.stop()
    families = {f.name: f for f in text_string_to_metric_families(exposition.render().decode())}
    counts = {(s.labels["gpu"], s.labels["xid"]): s.value for s in families["inferwatch_gpu_xid_errors"].samples}
    expected: dict = {}
    for i in range(300):
        key = (str(i % 2), "79" if i % 3 else "48")
        expected[key] = expected.get(key, 0) + 1
    assert counts == expected and sum(counts.values()) == 300
    assert len(scrapes) > 10
    assert {s.labels["gpu"] for s in families["inferwatch_gpu_last_xid_timestamp_seconds"].samples} == {"0", "1"}


def test_cached_render_changes_only_with_new_data():
    nvml = fleet(1)
    sampler = Sampler(nvml)
    sampler.start()
    store = SnapshotStore(sampler.sample())
    ticks = iter([100.0, 101.0, 102.0, 103.0])
    exposition = CachedExposition(store, clock=lambda: store.latest.taken_at + next(ticks))
    a, b = exposition.render(), exposition.render()
    strip = lambda body: body.rsplit(b"# HELP inferwatch_nvml_snapshot_age_seconds", 1)[0]  # noqa: E731
    assert strip(a) == strip(b) and a.endswith(b"age_seconds 100.0\n") and b.endswith(b"age_seconds 101.0\n")
    calls = nvml.calls
    exposition.render()
    assert nvml.calls == calls  # a scrape never calls NVML
    nvml.devices[0].power_mw = 123_000
    store.publish(sampler.sample())
    fresh = exposition.render()
    assert next(line for line in fresh.splitlines() if line.startswith(b"inferwatch_gpu_power_watts{")).endswith(b" 123.0")


def test_http_endpoint():
    exporter = Exporter(ExporterSettings(port=0, interval_s=0.05), fleet(1))
    exporter.start()
    server = make_server(exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(f"{base}/metrics") as r:
            assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
            first = r.read()
        assert b"inferwatch_gpu_utilization_ratio{" in first
        time.sleep(0.3)
        with urllib.request.urlopen(f"{base}/metrics") as r:
            second = r.read()
        stamp = lambda body: [line for line in body.splitlines() if line.startswith(b"inferwatch_nvml_snapshot_timestamp")]  # noqa: E731
        assert stamp(first) != stamp(second)  # the sampler thread keeps publishing
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{base}/nope")
        assert info.value.code == 404
    finally:
        server.shutdown()
        server.server_close()
        exporter.stop()


@pytest.mark.parametrize("field, value", [("port", -1), ("interval_s", 0), ("slow_interval_s", -5)])
def test_settings_validation(field, value):
    with pytest.raises(Exception) as info:
        ExporterSettings(**{field: value})
    assert field in str(info.value)


def test_what_a_mig_partitioned_h100_exports_and_what_it_does_not():
    """docs/exporter.md's MIG list, as the fake models NVML in MIG mode: the GPU's own
    readings and each instance's memory; its NVLinks down (NVML reports them so); no device
    utilization (NVML does not support it) and, where the whole GPU's GPM sample answers
    NotSupported, no GPM activity (the exporter does not read GPM per GPU instance): absent,
    not 0, and neither a failed GPU nor a collection error."""
    clock = Clock()
    nvml = fleet(1, clock=clock)
    nvml.devices[0].mig = [FakeMig(1, 0, "MIG-a", 10 * 2**30, 2**30), FakeMig(2, 0, "MIG-b", 20 * 2**30, 0)]
    sampler = Sampler(nvml, monotonic=clock)
    sampler.start()
    sampler.sample()
    clock.now += 1.0  # a whole GPM interval: activity would be exported now if NVML answered it
    exposition = CachedExposition(SnapshotStore(sampler.sample()))
    families = {f.name: f for f in text_string_to_metric_families(exposition.render().decode())}
    for name in ("inferwatch_gpu_temperature_celsius", "inferwatch_gpu_power_watts", "inferwatch_gpu_energy_joules",
                 "inferwatch_gpu_memory_used_bytes", "inferwatch_gpu_sm_clock_hertz",
                 "inferwatch_gpu_pcie_tx_bytes_per_second"):
        assert value(families, name) is not None, name
    assert {s.labels["mig_uuid"] for s in families["inferwatch_gpu_mig_memory_used_bytes"].samples} == {"MIG-a", "MIG-b"}
    assert {s.value for s in families["inferwatch_gpu_nvlink_up"].samples} == {0.0}
    for name in ("inferwatch_gpu_utilization_ratio", "inferwatch_gpu_sm_active_ratio",
                 "inferwatch_gpu_tensor_active_ratio", "inferwatch_gpu_nvlink_tx_bytes"):
        assert name not in families, name
    assert sampler.devices[0].gpm is None  # NotSupported: turned off for this GPU
    assert value(families, "inferwatch_gpu_device_failed") == 0
    assert "inferwatch_gpu_collection_errors" not in families or not families["inferwatch_gpu_collection_errors"].samples
