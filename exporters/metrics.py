"""Every metric the NVML exporter exports, declared once.

Per-GPU series carry ``GPU_LABELS`` (index, uuid, model name, PCI bus id) so a series can
be joined to a node, a vLLM instance (through per-process memory) or a hardware ticket.
Units are base units: bytes, watts, joules, hertz, seconds, ratios in 0..1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GPU_LABELS = ("gpu", "uuid", "name", "pci_bus_id")


@dataclass(frozen=True)
class MetricSpec:
    name: str  # counters without the _total suffix, as prometheus_client expects
    kind: Literal["gauge", "counter"]
    doc: str
    labels: tuple[str, ...] = ()  # in addition to GPU_LABELS when per_gpu
    per_gpu: bool = True

    @property
    def label_names(self) -> tuple[str, ...]:
        return (GPU_LABELS + self.labels) if self.per_gpu else self.labels


def _g(name: str, doc: str, *labels: str) -> MetricSpec:
    return MetricSpec(f"inferwatch_gpu_{name}", "gauge", doc, labels)


def _c(name: str, doc: str, *labels: str) -> MetricSpec:
    return MetricSpec(f"inferwatch_gpu_{name}", "counter", doc, labels)


THROTTLE_REASONS = {  # NVML clocks-event bit -> label value
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

SPECS: tuple[MetricSpec, ...] = (
    _g("info", "1 for every GPU; its labels identify the device."),
    _g("device_failed", "1 if the last sample of this GPU failed (GPU lost, unknown error); its other series are stale."),
    _g("utilization_ratio", "Share of the last sample period in which a kernel ran on the GPU."),
    _g("memory_utilization_ratio", "Share of the last sample period in which device memory was read or written."),
    _g("memory_used_bytes", "Device memory in use."),
    _g("memory_free_bytes", "Device memory free."),
    _g("memory_total_bytes", "Device memory installed."),
    _g("temperature_celsius", "GPU die temperature."),
    _g("memory_temperature_celsius", "HBM temperature (where the GPU reports it)."),
    _g("power_watts", "Power draw."),
    _g("power_limit_watts", "Enforced power limit."),
    _c("energy_joules", "Energy used since the driver loaded."),
    _g("sm_clock_hertz", "Streaming multiprocessor clock."),
    _g("memory_clock_hertz", "Memory clock."),
    _g("sm_clock_max_hertz", "Highest SM clock the GPU supports."),
    _g("memory_clock_max_hertz", "Highest memory clock the GPU supports."),
    _g("performance_state", "P-state: 0 is the fastest, 15 the slowest."),
    _g("throttle_active", "1 while the reason holds clocks down (NVML clocks-event reasons).", "reason"),
    _g("pcie_tx_bytes_per_second", "PCIe transmit throughput over the last 20 ms."),
    _g("pcie_rx_bytes_per_second", "PCIe receive throughput over the last 20 ms."),
    _c("pcie_replays", "PCIe replays (link-level retransmissions): a rising rate means a bad link."),
    _g("nvlink_up", "1 per active NVLink link.", "link"),
    _c("nvlink_tx_bytes", "NVLink data transmitted.", "link"),
    _c("nvlink_rx_bytes", "NVLink data received.", "link"),
    _c("nvlink_errors", "NVLink data-link errors by type (crc_flit, crc_data, replay, recovery).", "link", "type"),
    _c("ecc_errors", "ECC errors; scope 'volatile' counts since driver load, 'aggregate' over the GPU's life.",
       "type", "scope"),
    _g("retired_pages", "Memory pages retired, by cause (pre-Ampere page retirement).", "cause"),
    _g("retired_pages_pending", "1 if a page retirement waits for a reboot."),
    _g("remapped_rows", "Memory rows remapped (Ampere and later), by error type.", "type"),
    _g("row_remap_pending", "1 if a row remap waits for a GPU reset."),
    _g("row_remap_failure", "1 if a row remap failed: the GPU needs service."),
    _g("fan_speed_ratio", "Fan speed as a share of its maximum (absent on passively cooled GPUs)."),
    _g("encoder_utilization_ratio", "Video encoder utilization."),
    _g("decoder_utilization_ratio", "Video decoder utilization."),
    _g("mig_enabled", "1 if MIG mode is on."),
    _g("mig_memory_used_bytes", "Memory used per MIG instance.", "gpu_instance", "compute_instance", "mig_uuid"),
    _g("mig_memory_total_bytes", "Memory per MIG instance.", "gpu_instance", "compute_instance", "mig_uuid"),
    _g("process_memory_used_bytes", "GPU memory per process (opt-in: --processes).", "pid", "process"),
    _c("xid_errors", "XID errors reported by the driver, by XID code.", "xid"),
    _g("last_xid_timestamp_seconds", "Unix time of the last XID error on this GPU."),
    _c("collection_errors", "NVML queries that failed on this GPU, by query.", "query"),
    MetricSpec("inferwatch_nvml_up", "gauge", "1 if NVML initialised and devices are being sampled.", per_gpu=False),
    MetricSpec("inferwatch_nvml_info", "gauge", "Driver and CUDA versions (value 1).",
               ("driver_version", "cuda_version"), per_gpu=False),
    MetricSpec("inferwatch_nvml_devices", "gauge", "GPUs NVML reports.", per_gpu=False),
    MetricSpec("inferwatch_nvml_sampler_duration_seconds", "gauge", "How long the last sampling cycle took.",
               per_gpu=False),
    MetricSpec("inferwatch_nvml_snapshot_timestamp_seconds", "gauge",
               "Unix time of the snapshot being served; time() minus this is its age.", per_gpu=False),
)

