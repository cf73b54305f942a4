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
    0x200: "board_limit",  # newer drivers; exported only where NVML lists the reason as supported
    0x400: "reliability",
}

MIB = 1024 * 1024

# GPM (Hopper and later): NVML_GPM_METRIC_* constant -> (metric, factor to base units). Read as
# the average between two samples one sampler interval apart, so unlike utilization_ratio
# (any kernel running during a 1/6 s window) they say how much of the GPU did work.
GPM_METRICS = {
    "NVML_GPM_METRIC_SM_UTIL": ("inferwatch_gpu_sm_active_ratio", 0.01),
    "NVML_GPM_METRIC_SM_OCCUPANCY": ("inferwatch_gpu_sm_occupancy_ratio", 0.01),
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": ("inferwatch_gpu_tensor_active_ratio", 0.01),
    "NVML_GPM_METRIC_DRAM_BW_UTIL": ("inferwatch_gpu_dram_active_ratio", 0.01),
    "NVML_GPM_METRIC_GRAPHICS_UTIL": ("inferwatch_gpu_graphics_active_ratio", 0.01),
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC": ("inferwatch_gpu_gpm_pcie_tx_bytes_per_second", MIB),
    "NVML_GPM_METRIC_PCIE_RX_PER_SEC": ("inferwatch_gpu_gpm_pcie_rx_bytes_per_second", MIB),
    "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": ("inferwatch_gpu_gpm_nvlink_tx_bytes_per_second", MIB),
    "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": ("inferwatch_gpu_gpm_nvlink_rx_bytes_per_second", MIB),
}

TEMPERATURE_THRESHOLDS = {  # NVML_TEMPERATURE_THRESHOLD_* constant -> label value
    "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN": "slowdown",
    "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN": "shutdown",
    "NVML_TEMPERATURE_THRESHOLD_GPU_MAX": "gpu_max",
    "NVML_TEMPERATURE_THRESHOLD_MEM_MAX": "memory_max",
}

COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}  # NVML_COMPUTEMODE_*

SPECS: tuple[MetricSpec, ...] = (
    _g("info", "1 for every GPU; its labels identify the device."),
    _g("device_failed", "1 if the last sample of this GPU failed (GPU lost, unknown error); its other series are stale."),
    _g("utilization_ratio", "Share of the last sample period in which a kernel ran on the GPU (1 with a single "
                            "busy SM: see sm_active_ratio for how busy it is)."),
    _g("sm_active_ratio", "How busy the GPU is: share of SMs busy over the last sampler interval (GPM, Hopper+)."),
    _g("sm_occupancy_ratio", "Resident warps as a share of the SMs' maximum over the last interval (GPM)."),
    _g("tensor_active_ratio", "Share of SM time the tensor cores were busy, any precision, over the last interval "
                              "(GPM)."),
    _g("dram_active_ratio", "Device memory bandwidth used as a share of its peak over the last interval (GPM)."),
    _g("graphics_active_ratio", "Share of the last interval in which the graphics/compute engine was active (GPM)."),
    _g("gpm_pcie_tx_bytes_per_second", "PCIe transmit rate averaged over the last sampler interval (GPM)."),
    _g("gpm_pcie_rx_bytes_per_second", "PCIe receive rate averaged over the last sampler interval (GPM)."),
    _g("gpm_nvlink_tx_bytes_per_second", "NVLink transmit rate over all links, last sampler interval (GPM)."),
    _g("gpm_nvlink_rx_bytes_per_second", "NVLink receive rate over all links, last sampler interval (GPM)."),
    _g("memory_utilization_ratio", "Share of the last sample period in which device memory was read or written."),
    _g("memory_used_bytes", "Device memory in use (without the reserved memory where the v2 API exists)."),
    _g("memory_free_bytes", "Device memory free."),
    _g("memory_reserved_bytes", "Device memory the driver and firmware reserve (v2 API): neither used nor free."),
    _g("memory_total_bytes", "Device memory installed."),
    _g("temperature_celsius", "GPU die temperature."),
    _g("memory_temperature_celsius", "HBM temperature (where the GPU reports it)."),
    _g("temperature_threshold_celsius", "Temperature at which the GPU slows down, shuts down, or that it must stay "
                                        "under (gpu_max, memory_max).", "threshold"),
    _g("power_watts", "Power draw."),
    _g("power_limit_watts", "Enforced power limit."),
    _g("power_limit_default_watts", "Power limit the GPU ships with."),
    _g("power_limit_min_watts", "Lowest power limit that can be set."),
    _g("power_limit_max_watts", "Highest power limit that can be set."),
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
    _g("pcie_link_generation", "PCIe generation the link runs at now (drops when idle on some GPUs)."),
    _g("pcie_link_generation_max", "Highest PCIe generation the GPU and its slot support."),
    _g("pcie_link_width", "PCIe lanes in use now; below the maximum means a degraded link or riser."),
    _g("pcie_link_width_max", "PCIe lanes the GPU and its slot support."),
    _g("ecc_enabled", "1 if ECC is on."),
    _g("ecc_pending_enabled", "1 if ECC will be on after the next reboot."),
    _g("persistence_mode_enabled", "1 if persistence mode keeps the driver loaded without clients."),
    _g("compute_mode", "1 for the GPU's compute mode (default, exclusive_process, prohibited).", "mode"),
    _g("nvlink_up", "1 per active NVLink link, 0 per link NVML reports disabled.", "link"),
    _c("nvlink_tx_bytes", "NVLink data transmitted.", "link"),
    _c("nvlink_rx_bytes", "NVLink data received.", "link"),
    _c("nvlink_errors", "NVLink data-link errors by type (crc_flit, crc_data, replay, recovery).", "link", "type"),
    _c("nvlink_ecc_data_errors", "NVLink data ECC errors over all links (NVML has per-link counters for links "
                                 "0-11 only)."),
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
    _g("nvml_duration_seconds", "How long this GPU's NVML queries took in the last sampling cycle: a GPU whose "
                                "calls slow down is often the one failing."),
    _g("nvml_call_seconds", "How long the NVML call in progress on this GPU has been running, while it has run "
                            "for over a second (read at the scrape: the sampler waits on it, the scrape does not).",
       "query"),
    _g("pod_info", "1 per GPU and container holding it, as the kubelet's pod-resources API lists them (Kubernetes "
                   "only); shared is true when several containers hold the GPU (time-slicing, or MIG devices of it), "
                   "whose utilization and power are then theirs together.",
       "namespace", "pod", "container", "resource", "device", "shared"),
    _g("allocatable", "1 if the kubelet may hand this GPU (or a MIG device of it) to a pod, 0 if its device plugin "
                      "does not offer it (unhealthy): Kubernetes only, where the kubelet answers "
                      "GetAllocatableResources."),
    MetricSpec("inferwatch_podresources_up", "gauge", "1 if the kubelet's pod-resources API answered the last List "
               "(present once it has answered): while 0, the last answer's pods are served.", per_gpu=False),
    MetricSpec("inferwatch_podresources_errors", "counter", "pod-resources List calls that failed, by reason "
               "(deadline_exceeded, unavailable, socket_missing, ...).", ("reason",), per_gpu=False),
    MetricSpec("inferwatch_nvml_up", "gauge", "1 if NVML initialised and devices are being sampled.", per_gpu=False),
    MetricSpec("inferwatch_nvml_info", "gauge", "Driver and CUDA versions (value 1).",
               ("driver_version", "cuda_version"), per_gpu=False),
    MetricSpec("inferwatch_nvml_devices", "gauge", "GPUs NVML reports.", per_gpu=False),
    MetricSpec("inferwatch_nvml_sampler_duration_seconds", "gauge", "How long the last sampling cycle took.",
               per_gpu=False),
    MetricSpec("inferwatch_nvml_sampler_errors", "counter",
               "Sampling cycles that failed with an unexpected error (a bug, not NVML): the sampler logs it and "
               "goes on; while it fails, the snapshot ages.", per_gpu=False),
    MetricSpec("inferwatch_nvml_snapshot_timestamp_seconds", "gauge",
               "Unix time of the snapshot being served; time() minus this is its age.", per_gpu=False),
)


# Host series, read fresh at every scrape (exporters/host.py): the stack ships no
# node_exporter, and the meta-monitoring alerts (alerts/meta.py) need the disks that hold
# Prometheus' TSDB, the drift database and the model caches, and the host's memory.
HOST_SPECS: tuple[MetricSpec, ...] = (
    MetricSpec("inferwatch_host_filesystem_avail_bytes", "gauge",
               "Bytes an unprivileged process can still write on the filesystem holding the watched path "
               "(statvfs f_bavail, df's Avail).", ("path",), per_gpu=False),
    MetricSpec("inferwatch_host_filesystem_size_bytes", "gauge",
               "Size of the filesystem holding the watched path (statvfs f_blocks).", ("path",), per_gpu=False),
    MetricSpec("inferwatch_host_filesystem_up", "gauge",
               "1 if the watched path could be statvfs'd at this scrape; 0 (and no size or avail series) if it is "
               "missing or unreadable.", ("path",), per_gpu=False),
    MetricSpec("inferwatch_host_memory_available_bytes", "gauge",
               "Memory available for new work without swapping (/proc/meminfo MemAvailable).", per_gpu=False),
    MetricSpec("inferwatch_host_memory_total_bytes", "gauge", "Usable memory (/proc/meminfo MemTotal).",
               per_gpu=False),
)
