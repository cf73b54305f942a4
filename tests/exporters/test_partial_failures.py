"""What real nodes do: disabled NVLinks, NotSupported for one argument of a query, a GPU
lost before the exporter starts. Each reading is checked against the fake's configuration."""

from __future__ import annotations

import time

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.exporters.collector import CachedExposition, SnapshotStore
from inferwatch.exporters.sampler import Sampler
from inferwatch.exporters.server import Exporter, ExporterSettings
from tests.support.clock import Clock
from tests.support.fleet import fleet


def families_of(sampler: Sampler) -> dict:
    text = CachedExposition(SnapshotStore(sampler.sample())).render().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def rows(families: dict, name: str, gpu: str = "0", **labels: str) -> dict[tuple, float]:
    """label values beyond GPU_LABELS -> value, for the samples of ``gpu`` matching ``labels``."""
    if name not in families:
        return {}
    out = {}
    for s in families[name].samples:
        if s.labels.get("gpu") == gpu and all(s.labels.get(k) == v for k, v in labels.items()):
            out[tuple(v for k, v in sorted(s.labels.items()) if k not in ("gpu", "uuid", "name", "pci_bus_id"))] = \
                s.value
    return out


def started(nvml, **kwargs) -> Sampler:
    sampler = Sampler(nvml, **kwargs)
    assert sampler.start()
    return sampler


def test_a_disabled_nvlink_reads_zero_and_its_counters_are_not_read():
    nvml = fleet(1)
    nvml.devices[0].nvlink_links = 4
    nvml.devices[0].nvlink_disabled = {2}
    families = families_of(started(nvml))
    assert rows(families, "inferwatch_gpu_nvlink_up") == {("0",): 1, ("1",): 1, ("2",): 0, ("3",): 1}
    assert set(rows(families, "inferwatch_gpu_nvlink_tx_bytes")) == {("0",), ("1",), ("3",)}
    assert {link for link, _ in rows(families, "inferwatch_gpu_nvlink_errors")} == {"0", "1", "3"}


def test_links_are_counted_by_nvml_not_until_the_first_error():
    """Link 1's state query answers NotSupported: links 2 and 3 are still there."""
    nvml = fleet(1)
    nvml.devices[0].nvlink_links = 4
    nvml.devices[0].unsupported = {("nvmlDeviceGetNvLinkState", 1)}
    families = families_of(started(nvml))
    assert rows(families, "inferwatch_gpu_nvlink_up") == {("0",): 1, ("2",): 1, ("3",): 1}
    assert rows(families, "inferwatch_gpu_nvlink_ecc_data_errors") == {(): 0}


def test_not_supported_hides_only_that_argument_and_is_not_asked_again():
    clock = Clock()
    nvml = fleet(1, clock=clock)
    nvml.devices[0].unsupported = {
        ("nvmlDeviceGetNvLinkErrorCounter", 0, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
        ("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_MEM),
        ("nvmlDeviceGetTotalEccErrors", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
        ("nvmlDeviceGetRetiredPages", pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        ("nvmlDeviceGetTemperatureThreshold", pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
    }
    sampler = started(nvml, monotonic=clock)
    before = nvml.calls
    families = families_of(sampler)
    first = nvml.calls - before
    assert set(rows(families, "inferwatch_gpu_nvlink_errors")) == {
        ("0", "replay"), ("0", "recovery"), ("0", "crc_flit"),
        ("1", "replay"), ("1", "recovery"), ("1", "crc_flit"), ("1", "crc_data")}
    assert "inferwatch_gpu_sm_clock_max_hertz" in families and "inferwatch_gpu_memory_clock_max_hertz" not in families
    assert set(rows(families, "inferwatch_gpu_ecc_errors")) == {
        ("volatile", "corrected"), ("aggregate", "corrected"), ("volatile", "uncorrected")}
    assert set(rows(families, "inferwatch_gpu_retired_pages")) == {("multiple_single_bit",)}
    assert set(rows(families, "inferwatch_gpu_temperature_threshold_celsius")) == {
        ("slowdown",), ("shutdown",), ("gpu_max",)}
    assert not families["inferwatch_gpu_collection_errors"].samples
    before = nvml.calls
    clock.now += 1
    sampler.sample()
    # the five NotSupported argument combinations and fan and MIG mode (absent on this H100)
    # are not asked again; GPM reads metrics now where its first cycle only took a sample
    assert nvml.calls - before == first - 7 + 1


@pytest.mark.parametrize("call, code", [
    ("nvmlDeviceGetHandleByIndex", pynvml.NVML_ERROR_GPU_IS_LOST),
    ("nvmlDeviceGetHandleByIndex", pynvml.NVML_ERROR_UNKNOWN),
    ("nvmlDeviceGetUUID", pynvml.NVML_ERROR_GPU_IS_LOST),
])
def test_a_gpu_lost_at_start_does_not_blank_the_node_and_is_discovered_later(call, code):
    nvml = fleet(3)
    nvml.fail(call, 1, code)
    sampler = started(nvml)
    families = families_of(sampler)
    assert families["inferwatch_nvml_up"].samples[0].value == 1
    assert families["inferwatch_nvml_devices"].samples[0].value == 3
    assert rows(families, "inferwatch_gpu_device_failed", "0") == {(): 0}
    assert rows(families, "inferwatch_gpu_device_failed", "2") == {(): 0}
    lost = [s for s in families["inferwatch_gpu_device_failed"].samples if s.labels["gpu"] == "1"]
    assert [(s.labels["uuid"], s.value) for s in lost] == [("", 1)]
    assert rows(families, "inferwatch_gpu_power_watts", "2") == {(): 252.0}
    assert rows(families, "inferwatch_gpu_power_watts", "1") == {}
    assert rows(families, "inferwatch_gpu_collection_errors", "1") == {(call,): 2}  # at start, and this cycle

    nvml.clear(call, 1)
    families = families_of(sampler)
    failed = {(s.labels["gpu"], s.labels["uuid"]): s.value for s in families["inferwatch_gpu_device_failed"].samples}
    assert failed == {("0", nvml.devices[0].uuid): 0, ("1", nvml.devices[1].uuid): 0, ("2", nvml.devices[2].uuid): 0}
    assert rows(families, "inferwatch_gpu_power_watts", "1") == {(): 251.0}
    assert [d.index for d in sampler.devices] == [0, 1, 2]


def test_xid_of_a_gpu_discovered_after_start_is_counted_under_its_labels():
    nvml = fleet(2)
    nvml.fail("nvmlDeviceGetHandleByIndex", 1, pynvml.NVML_ERROR_GPU_IS_LOST)
    exporter = Exporter(ExporterSettings(port=0, interval_s=0.02), nvml)
    exporter.start()
    try:
        nvml.clear("nvmlDeviceGetHandleByIndex", 1)
        uuid = nvml.devices[1].uuid.encode()
        deadline = time.monotonic() + 10
        while b'xid="79"' not in exporter.exposition.render() and time.monotonic() < deadline:
            if uuid in exporter.exposition.render():
                nvml.emit_xid(1, 79)
            time.sleep(0.02)
        families = {f.name: f for f in text_string_to_metric_families(exporter.exposition.render().decode())}
        xids = [(s.labels["gpu"], s.labels["uuid"], s.labels["xid"]) for s in
                families["inferwatch_gpu_xid_errors"].samples]
        assert xids and set(xids) == {("1", nvml.devices[1].uuid, "79")}
    finally:
        exporter.stop()


def test_nvlink_state_and_errors_stay_when_field_values_cannot_be_read_at_all():
    """State and error counters come from their own calls: a device that answers
    nvmlDeviceGetFieldValues NotSupported as a whole loses throughput and the ECC total only."""
    nvml = fleet(1)
    nvml.devices[0].nvlink_links = 2
    sampler = started(nvml)
    nvml.devices[0].unsupported = {"nvmlDeviceGetFieldValues"}
    families = families_of(sampler)
    assert rows(families, "inferwatch_gpu_nvlink_up") == {("0",): 1, ("1",): 1}
    assert len(rows(families, "inferwatch_gpu_nvlink_errors")) == 8
    assert not rows(families, "inferwatch_gpu_nvlink_tx_bytes") and not rows(families, "inferwatch_gpu_nvlink_ecc_data_errors")
    assert "inferwatch_gpu_memory_temperature_celsius" not in families
    assert not families["inferwatch_gpu_collection_errors"].samples


def test_clock_event_reasons_the_driver_cannot_list_are_absent_not_zero():
    """Without the supported-reasons mask, the reasons NVML defined before 0x200 are exported
    and board_limit and reliability, which only recent drivers report, are not."""
    nvml = fleet(1)
    nvml.devices[0].unsupported = {"nvmlDeviceGetSupportedClocksEventReasons"}
    nvml.devices[0].throttle_reasons = 0x40
    active = {r: v for (r,), v in rows(families_of(started(nvml)), "inferwatch_gpu_throttle_active").items()}
    assert len(active) == 9 and "board_limit" not in active and "reliability" not in active
    assert {r for r, v in active.items() if v} == {"hw_thermal_slowdown"}
