"""GPM profiling metrics by the two-sample method, v2 memory, PCIe link, modes, limits and
the newer clock-event reasons, each against the fake's configuration in NVML's units."""

from __future__ import annotations

import pynvml
import pytest

from inferwatch.exporters.sampler import Sampler
from tests.exporters.test_partial_failures import families_of, rows, started
from tests.support.clock import Clock
from tests.support.fleet import fleet, h100

GPM = {  # metric -> (NVML_GPM_METRIC_* id, factor from NVML's unit)
    "inferwatch_gpu_graphics_active_ratio": (pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, 0.01),
    "inferwatch_gpu_sm_active_ratio": (pynvml.NVML_GPM_METRIC_SM_UTIL, 0.01),
    "inferwatch_gpu_sm_occupancy_ratio": (pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, 0.01),
    "inferwatch_gpu_tensor_active_ratio": (pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, 0.01),
    "inferwatch_gpu_dram_active_ratio": (pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, 0.01),
    "inferwatch_gpu_gpm_pcie_tx_bytes_per_second": (pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, 2**20),
    "inferwatch_gpu_gpm_pcie_rx_bytes_per_second": (pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, 2**20),
    "inferwatch_gpu_gpm_nvlink_tx_bytes_per_second": (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, 2**20),
    "inferwatch_gpu_gpm_nvlink_rx_bytes_per_second": (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, 2**20),
}


def test_gpm_metrics_are_averages_between_two_samples_one_interval_apart():
    clock = Clock()
    nvml = fleet(2, clock=clock)
    sampler = started(nvml, monotonic=clock)
    first = families_of(sampler)  # one sample per GPU: no interval yet
    assert not set(GPM) & set(first)
    for _ in range(3):
        clock.now += 1.0
        families = families_of(sampler)
        for gpu in ("0", "1"):
            assert rows(families, "inferwatch_gpu_device_failed", gpu) == {(): 0}
            for name, (metric_id, factor) in GPM.items():
                want = nvml.devices[int(gpu)].gpm[metric_id] * factor
                assert rows(families, name, gpu) == {(): pytest.approx(want)}, (name, gpu)
        nvml.devices[0].gpm[pynvml.NVML_GPM_METRIC_SM_UTIL] += 10.0  # busier in the next interval
    assert rows(families, "inferwatch_gpu_sm_active_ratio", "0") == {(): pytest.approx(0.60)}
    assert rows(families, "inferwatch_gpu_utilization_ratio", "0") == {(): 0.40}  # the two are not the same thing


def test_gpm_only_where_nvml_says_so_and_per_metric():
    clock = Clock()
    nvml = fleet(3, clock=clock)
    nvml.devices[1] = h100(1, name="NVIDIA A100-SXM4-80GB", gpm=None)  # pre-Hopper: isSupportedDevice 0
    del nvml.devices[2].gpm[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC]  # a PCIe card: no NVLink rates
    del nvml.devices[2].gpm[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC]
    sampler = started(nvml, monotonic=clock)
    assert [d.gpm is not None for d in sampler.devices] == [True, False, True]
    families_of(sampler)
    clock.now += 1
    families = families_of(sampler)
    assert rows(families, "inferwatch_gpu_sm_active_ratio", "1") == {}
    assert rows(families, "inferwatch_gpu_sm_active_ratio", "2") == {(): pytest.approx(0.42)}
    assert rows(families, "inferwatch_gpu_gpm_nvlink_tx_bytes_per_second", "2") == {}
    assert rows(families, "inferwatch_gpu_gpm_nvlink_tx_bytes_per_second", "0") == {(): pytest.approx(2000 * 2**20)}
    assert not families["inferwatch_gpu_collection_errors"].samples

    off = Sampler(fleet(1), gpm=False)
    off.start()
    off.sample()
    assert "inferwatch_gpu_sm_active_ratio" not in off.sample().samples


def test_a_failed_gpm_read_restarts_the_interval_instead_of_spanning_it():
    clock = Clock()
    nvml = fleet(1, clock=clock)
    sampler = started(nvml, monotonic=clock)
    families_of(sampler)
    clock.now += 1
    assert rows(families_of(sampler), "inferwatch_gpu_sm_active_ratio") == {(): pytest.approx(0.40)}
    nvml.fail("nvmlGpmSampleGet", 0, pynvml.NVML_ERROR_UNKNOWN, times=1)
    clock.now += 1
    families = families_of(sampler)
    assert rows(families, "inferwatch_gpu_device_failed") == {(): 1}
    assert rows(families, "inferwatch_gpu_collection_errors") == {("nvmlGpmSampleGet",): 1}
    nvml.devices[0].gpm[pynvml.NVML_GPM_METRIC_SM_UTIL] = 90.0
    clock.now += 1
    families = families_of(sampler)  # a fresh first sample: nothing to average yet
    assert rows(families, "inferwatch_gpu_device_failed") == {(): 0}
    assert rows(families, "inferwatch_gpu_sm_active_ratio") == {}
    clock.now += 1
    assert rows(families_of(sampler), "inferwatch_gpu_sm_active_ratio") == {(): pytest.approx(0.90)}

    readers = [d.gpm for d in sampler.devices]
    sampler.stop()
    assert all(nvml.gpm_freed(s) for r in readers for s in (r._previous, r._current))


def test_memory_through_the_v2_api_and_v1_on_older_drivers():
    nvml = fleet(2)
    nvml.devices[1].memory_reserved = None  # driver without nvmlDeviceGetMemoryInfo_v2
    families = families_of(started(nvml))
    d0, d1 = nvml.devices
    assert rows(families, "inferwatch_gpu_memory_reserved_bytes", "0") == {(): d0.memory_reserved}
    assert rows(families, "inferwatch_gpu_memory_used_bytes", "0") == {(): d0.memory_used}
    assert rows(families, "inferwatch_gpu_memory_free_bytes", "0") == {
        (): d0.memory_total - d0.memory_used - d0.memory_reserved}
    assert rows(families, "inferwatch_gpu_memory_reserved_bytes", "1") == {}
    assert rows(families, "inferwatch_gpu_memory_used_bytes", "1") == {(): d1.memory_used}
    assert rows(families, "inferwatch_gpu_memory_total_bytes", "1") == {(): d1.memory_total}
    assert not families["inferwatch_gpu_collection_errors"].samples


def test_pcie_link_modes_limits_and_nvlink_ecc():
    nvml = fleet(2)
    d = nvml.devices[1]
    d.pcie_link = (4, 5, 8, 16)  # a degraded link: gen4 x8 in a gen5 x16 slot
    d.ecc_mode, d.persistence_mode, d.compute_mode = (0, 1), 0, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    d.power_default_limit_mw, d.power_limit_constraints_mw = 650_000, (200_000, 700_000)
    d.temperature_thresholds = {pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
                                pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
                                pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87}  # no memory maximum
    d.nvlink_ecc_data_errors = 17
    families = families_of(started(nvml))
    expected = {
        "inferwatch_gpu_pcie_link_generation": 4, "inferwatch_gpu_pcie_link_generation_max": 5,
        "inferwatch_gpu_pcie_link_width": 8, "inferwatch_gpu_pcie_link_width_max": 16,
        "inferwatch_gpu_ecc_enabled": 0, "inferwatch_gpu_ecc_pending_enabled": 1,
        "inferwatch_gpu_persistence_mode_enabled": 0,
        "inferwatch_gpu_power_limit_default_watts": 650.0, "inferwatch_gpu_power_limit_min_watts": 200.0,
        "inferwatch_gpu_power_limit_max_watts": 700.0, "inferwatch_gpu_nvlink_ecc_data_errors_total": 17,
    }
    for name, want in expected.items():
        family = name.removesuffix("_total")
        assert rows(families, family, "1") == {(): want}, name
    assert rows(families, "inferwatch_gpu_compute_mode", "1") == {("exclusive_process",): 1}
    assert rows(families, "inferwatch_gpu_compute_mode", "0") == {("default",): 1}
    assert rows(families, "inferwatch_gpu_temperature_threshold_celsius", "1") == {
        ("shutdown",): 92, ("slowdown",): 89, ("gpu_max",): 87}
    assert rows(families, "inferwatch_gpu_ecc_enabled", "0") == {(): 1}


def test_clock_event_reasons_board_limit_and_reliability_where_supported():
    nvml = fleet(2)
    nvml.devices[0].throttle_reasons = 0x200 | 0x400 | 0x1
    nvml.devices[1].throttle_reasons = 0x200
    nvml.devices[1].supported_clock_reasons = 0x1FF  # an older driver: knows nothing past 0x100
    families = families_of(started(nvml))
    active0 = {r: v for (r,), v in rows(families, "inferwatch_gpu_throttle_active", "0").items()}
    assert {r for r, v in active0.items() if v} == {"board_limit", "reliability", "gpu_idle"} and len(active0) == 11
    active1 = {r: v for (r,), v in rows(families, "inferwatch_gpu_throttle_active", "1").items()}
    assert len(active1) == 9 and not any(active1.values())  # unknown reasons absent, not 0


def test_gpm_waits_for_nvmls_shortest_interval_and_serves_the_last_values_meanwhile():
    """A sampler interval under 100 ms: GPM takes a new sample only once 100 ms have passed
    since the last, so each value still spans at least NVML's shortest interval."""
    clock = Clock()
    nvml = fleet(1, clock=clock)
    sampler = started(nvml, monotonic=clock)
    sampler.sample()
    gets = []
    real_get = nvml.nvmlGpmSampleGet
    nvml.nvmlGpmSampleGet = lambda device, gpmSample: gets.append(clock.now) or real_get(device, gpmSample)
    seen = []
    for _ in range(12):  # 12 cycles 30 ms apart
        clock.now += 0.03
        seen.append(rows(families_of(sampler), "inferwatch_gpu_sm_active_ratio").get(()))
        nvml.devices[0].gpm[pynvml.NVML_GPM_METRIC_SM_UTIL] += 1.0
    assert len(gets) == 3 and all(b - a >= 0.1 for a, b in zip([100.0] + gets, gets))
    assert seen[:3] == [None] * 3  # the first sample is 90 ms old: no interval yet
    assert seen[3] is not None and seen[3:7] == [seen[3]] * 4 and seen[7] != seen[6]
