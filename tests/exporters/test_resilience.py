"""The exporter stays up whatever NVML answers, and says so honestly: an NVML error while a
GPU is discovered, a GPU that fails half-way through its readings, NVML lost mid-run, an
unexpected exception in the sampler thread, a GPU that stays failed for hours."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.exporters.collector import CachedExposition, SnapshotStore
from inferwatch.exporters.sampler import Sampler
from inferwatch.exporters.server import Exporter, ExporterSettings, make_server
from inferwatch.exporters.xid import XidWatcher
from tests.support.fleet import FakeProcess, fleet
from tests.support.waiting import eventually


def families_of(exposition: CachedExposition) -> dict:
    return {f.name: f for f in text_string_to_metric_families(exposition.render().decode())}


def scrape(sampler: Sampler) -> dict:
    return families_of(CachedExposition(SnapshotStore(sampler.sample())))


def of_gpu(families: dict, gpu: str) -> dict[str, list]:
    """Family name -> the samples that carry ``gpu``."""
    out = {name: [s for s in f.samples if s.labels.get("gpu") == gpu] for name, f in families.items()}
    return {name: rows for name, rows in out.items() if rows}


# -- discovery ------------------------------------------------------------------------------
@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN])
def test_a_gpu_whose_gpm_query_fails_at_start_is_lost_not_fatal_and_discovered_again(code):
    nvml = fleet(2)
    nvml.fail("nvmlGpmQueryDeviceSupport", 1, code, times=1)
    sampler = Sampler(nvml)
    assert sampler.start()
    assert [d.index for d in sampler.devices] == [0]
    first = scrape(sampler)  # GPU 1 is discovered again in this cycle, GPM included
    errors = {(s.labels["gpu"], s.labels["uuid"], s.labels["query"]): s.value
              for s in first["inferwatch_gpu_collection_errors"].samples}
    assert errors == {("1", "", "nvmlGpmQueryDeviceSupport"): 1}
    assert [d.index for d in sampler.devices] == [0, 1]
    time.sleep(0.11)  # GPM's shortest interval
    again = scrape(sampler)
    assert {s.labels["gpu"] for s in again["inferwatch_gpu_sm_active_ratio"].samples} == {"0", "1"}


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, pynvml.NVML_ERROR_INVALID_ARGUMENT])
def test_a_gpm_query_this_driver_cannot_answer_skips_gpm_on_that_gpu_only(code):
    """The bindings' structure version is one this driver does not know: GPM is unavailable
    there, the GPU itself is fine."""
    nvml = fleet(2)
    nvml.fail("nvmlGpmQueryDeviceSupport", 1, code)
    sampler = Sampler(nvml)
    assert sampler.start()
    assert [d.index for d in sampler.devices] == [0, 1]
    sampler.sample()
    time.sleep(0.11)
    families = scrape(sampler)
    assert {s.labels["gpu"] for s in families["inferwatch_gpu_sm_active_ratio"].samples} == {"0"}
    assert {s.labels["gpu"]: s.value for s in families["inferwatch_gpu_device_failed"].samples} == {"0": 0, "1": 0}
    assert not families["inferwatch_gpu_collection_errors"].samples


def test_a_gpu_lost_at_start_whose_gpm_query_fails_on_rediscovery_stays_lost_for_that_cycle():
    nvml = fleet(2)
    nvml.fail("nvmlDeviceGetHandleByIndex", 1, pynvml.NVML_ERROR_GPU_IS_LOST, times=1)
    sampler = Sampler(nvml)
    assert sampler.start()
    nvml.fail("nvmlGpmQueryDeviceSupport", 1, pynvml.NVML_ERROR_GPU_IS_LOST, times=1)
    families = scrape(sampler)
    failed = {(s.labels["gpu"], s.labels["uuid"]): s.value for s in families["inferwatch_gpu_device_failed"].samples}
    assert failed == {("0", nvml.devices[0].uuid): 0, ("1", ""): 1}
    families = scrape(sampler)
    failed = {(s.labels["gpu"], s.labels["uuid"]): s.value for s in families["inferwatch_gpu_device_failed"].samples}
    assert failed == {("0", nvml.devices[0].uuid): 0, ("1", nvml.devices[1].uuid): 0}


def test_the_sampler_thread_survives_an_nvml_error_while_rediscovering_a_gpu():
    """The reviewer's case: GPU 1 lost at start, its GPM query fails once when it comes back."""
    nvml = fleet(2)
    nvml.fail("nvmlDeviceGetHandleByIndex", 1, pynvml.NVML_ERROR_GPU_IS_LOST, times=2)
    exporter = Exporter(ExporterSettings(port=0, interval_s=0.02), nvml)
    exporter.start()
    try:
        nvml.fail("nvmlGpmQueryDeviceSupport", 1, pynvml.NVML_ERROR_UNKNOWN, times=1)
        seq = exporter.store.latest.seq
        eventually(lambda: exporter.store.latest.seq > seq + 20)
        assert exporter._thread.is_alive()
        eventually(lambda: [d.index for d in exporter.sampler.devices] == [0, 1])
        assert exporter.health()[0]
    finally:
        exporter.stop()


# -- a failed GPU -----------------------------------------------------------------------------
def test_a_gpu_that_fails_mid_cycle_exports_none_of_the_readings_taken_before():
    """Utilization, memory, GPM, temperatures are read before power: none of them may be
    served next to device_failed 1, or a dashboard shows a dead GPU's half-cycle as live."""
    nvml = fleet(2)
    nvml.devices[1].processes = [FakeProcess(1, 2**30)]
    sampler = Sampler(nvml, processes=True, slow_interval_s=3600)
    assert sampler.start()
    sampler.sample()
    time.sleep(0.11)
    healthy = of_gpu(scrape(sampler), "1")
    assert "inferwatch_gpu_sm_active_ratio" in healthy and "inferwatch_gpu_process_memory_used_bytes" in healthy
    nvml.fail("nvmlDeviceGetPowerUsage", 1, pynvml.NVML_ERROR_UNKNOWN)
    families = scrape(sampler)
    # beside the failure, only the exporter's own watch of it: how long its NVML calls took
    assert set(of_gpu(families, "1")) == {"inferwatch_gpu_device_failed", "inferwatch_gpu_collection_errors",
                                          "inferwatch_gpu_nvml_duration_seconds"}
    assert len(of_gpu(families, "0")) == len(healthy) - 1  # GPU 0 has no process list
    nvml.clear("nvmlDeviceGetPowerUsage", 1)
    scrape(sampler)  # GPM's interval restarts after the failure
    time.sleep(0.11)
    assert set(of_gpu(scrape(sampler), "1")) == set(healthy) | {"inferwatch_gpu_collection_errors"}


def test_a_persistently_failed_gpu_is_logged_when_its_state_changes_and_counted_every_cycle(caplog):
    nvml = fleet(2)
    sampler = Sampler(nvml)
    assert sampler.start()
    nvml.fail("nvmlDeviceGetPowerUsage", 1, pynvml.NVML_ERROR_GPU_IS_LOST)
    with caplog.at_level(logging.INFO, logger="inferwatch.exporters.sampler"):
        for _ in range(5):
            families = scrape(sampler)
        nvml.clear("nvmlDeviceGetPowerUsage", 1)
        scrape(sampler)
        scrape(sampler)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "GPU 1" in warnings[0].getMessage()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "recovered" in r.getMessage()]
    errors = {s.labels["query"]: s.value for s in families["inferwatch_gpu_collection_errors"].samples
              if s.labels["gpu"] == "1"}
    assert errors == {"nvmlDeviceGetPowerUsage": 5}


# -- NVML lost mid-run ------------------------------------------------------------------------
@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_DRIVER_NOT_LOADED, pynvml.NVML_ERROR_UNINITIALIZED,
                                  pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH])
def test_nvml_lost_on_every_gpu_shuts_the_session_down_and_serves_up_zero(code):
    nvml = fleet(2)
    sampler = Sampler(nvml)
    assert sampler.start() and nvml.inits == 1
    nvml.fail("*", None, code)
    snapshot = sampler.sample()
    assert snapshot.samples["inferwatch_nvml_up"] == [((), 0.0)]
    assert "inferwatch_gpu_device_failed" not in snapshot.samples and not sampler.up
    assert nvml.inits == 0  # the dead session is released, so a re-init starts a fresh one
    assert not sampler.start(quiet=True) and nvml.inits == 0
    nvml.clear("*", None)
    assert sampler.start(quiet=True) and nvml.inits == 1
    assert [d.index for d in sampler.devices] == [0, 1]


def test_every_gpu_lost_keeps_nvml_up_and_every_gpu_failed():
    """GpuIsLost on all GPUs (XID 79 everywhere) is the GPUs' failure, not NVML's: each GPU
    keeps paging as failed instead of the node turning into an NVML ticket."""
    nvml = fleet(2)
    sampler = Sampler(nvml)
    assert sampler.start()
    nvml.fail("*", None, pynvml.NVML_ERROR_GPU_IS_LOST)
    snapshot = sampler.sample()
    assert snapshot.samples["inferwatch_nvml_up"] == [((), 1.0)]
    assert [v for _, v in snapshot.samples["inferwatch_gpu_device_failed"]] == [1.0, 1.0]
    assert nvml.inits == 1


def test_a_retry_that_fails_after_nvml_init_releases_the_session():
    nvml = fleet(2)
    nvml.fail("nvmlDeviceGetCount", None, pynvml.NVML_ERROR_UNKNOWN)
    sampler = Sampler(nvml)
    for _ in range(3):
        assert not sampler.start(quiet=True)
    assert nvml.inits == 0
    gpuless = fleet(0)  # NVML answers, with no GPU: retried like a missing driver, without a leak
    sampler = Sampler(gpuless)
    for _ in range(3):
        assert not sampler.start(quiet=True) and sampler.reason == "NVML found no GPU"
    assert gpuless.inits == 0


def test_the_exporter_reinitialises_nvml_after_losing_it_and_keeps_counting_xids():
    nvml = fleet(2)
    exporter = Exporter(ExporterSettings(port=0, interval_s=0.02, retry_s=0.1), nvml)
    exporter.start()
    try:
        nvml.emit_xid(0, 79)
        eventually(lambda: b'xid="79"' in exporter.exposition.render())
        nvml.fail("*", None, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        eventually(lambda: b"inferwatch_nvml_up 0.0" in exporter.exposition.render())
        nvml.clear("*", None)
        eventually(lambda: b"inferwatch_nvml_up 1.0" in exporter.exposition.render())
        eventually(lambda: exporter.xid is not None and 1 in exporter.xid._handles)
        nvml.emit_xid(1, 48)
        eventually(lambda: b'xid="48"' in exporter.exposition.render())
        families = families_of(exporter.exposition)
        xids = {(s.labels["gpu"], s.labels["xid"]): s.value for s in families["inferwatch_gpu_xid_errors"].samples}
        assert xids == {("0", "79"): 1, ("1", "48"): 1}  # counted across the re-init, not reset
        assert nvml.inits == 1
    finally:
        exporter.stop()
    assert nvml.inits == 0


def test_the_xid_thread_warns_once_while_nvml_is_down(caplog):
    nvml = fleet(1)
    sampler = Sampler(nvml)
    assert sampler.start()
    xid = XidWatcher(nvml, {0: sampler.devices[0].handle}, {0: sampler.devices[0].labels}, wait_ms=10,
                     retry_wait_s=0.01)
    with caplog.at_level(logging.DEBUG, logger="inferwatch.exporters.xid"):
        xid.start()
        nvml.fail("nvmlEventSetWait_v2", None, pynvml.NVML_ERROR_UNKNOWN, times=30)
        eventually(lambda: ("nvmlEventSetWait_v2", None) not in nvml._faults)
        nvml.emit_xid(0, 13)
        eventually(lambda: xid.version == 1)
        xid.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "waiting" in r.getMessage()]
    assert len(warnings) == 1
    assert [r for r in caplog.records if "resumed" in r.getMessage()]


# -- the sampler thread -----------------------------------------------------------------------
def test_an_unexpected_exception_in_a_cycle_is_logged_counted_and_sampling_continues(caplog, monkeypatch):
    nvml = fleet(1)
    exporter = Exporter(ExporterSettings(port=0, interval_s=0.02), nvml)
    exporter.start()
    real = exporter.sampler.sample
    calls = [0]

    def flaky():
        calls[0] += 1
        if calls[0] in (3, 4):
            raise KeyError("a bug, not NVML")
        return real()

    try:
        with caplog.at_level(logging.ERROR, logger="inferwatch.exporters.server"):
            monkeypatch.setattr(exporter.sampler, "sample", flaky)
            eventually(lambda: calls[0] > 10)
        assert exporter._thread.is_alive() and exporter.health()[0]
        families = families_of(exporter.exposition)
        assert families["inferwatch_nvml_sampler_errors"].samples[0].value == 2
        logged = [r for r in caplog.records if r.exc_info and "a bug, not NVML" in str(r.exc_info[1])]
        assert len(logged) == 1  # the same error again is counted, not logged again
    finally:
        exporter.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the point
def test_health_fails_when_the_sampler_thread_is_dead_or_its_snapshot_stale(monkeypatch):
    nvml = fleet(1)
    exporter = Exporter(ExporterSettings(port=0, interval_s=0.02), nvml)
    exporter.start()
    server = make_server(exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/health"

    def health() -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(url) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        assert health() == (200, {"status": "ok"})
        monkeypatch.setattr(exporter.sampler, "sample", lambda: (_ for _ in ()).throw(SystemExit(1)))
        eventually(lambda: not exporter._thread.is_alive())
        status, body = health()
        assert status == 503 and body["status"] == "sampler thread dead"
    finally:
        server.shutdown()
        server.server_close()
        exporter.stop()

    exporter = Exporter(ExporterSettings(port=0, interval_s=1), fleet(1))
    exporter.start()
    try:
        latest = exporter.store.latest
        exporter.store.publish(replace(latest, seq=latest.seq + 1, taken_at=time.time() - 3600))
        ok, why = exporter.health()
        assert not ok and why.startswith("snapshot stale")
    finally:
        exporter.stop()
