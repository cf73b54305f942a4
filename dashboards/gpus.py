"""GPUs, the USE side: utilization, saturation (throttling, memory), errors (ECC, XID)."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as dash_b

from inferwatch.alerts import cost, stragglers
from inferwatch.alerts.catalog import metric as m
from inferwatch.alerts.spec import JOB_EXPORTER, Spec
from inferwatch.dashboards import uids
from inferwatch.dashboards.health import RED_FROM_ONE, alerts_firing, targets_up
from inferwatch.dashboards.panels import (
    RATE,
    added_in_window,
    dashboard,
    or_zero,
    q,
    query_variable,
    stat_panel,
    timeseries_panel,
)

SEL = 'instance=~"$host", gpu=~"$gpu"'
GPU = "{{instance}} gpu{{gpu}}"


def g(name: str, extra: str = "") -> str:
    """A per-GPU series on the selected hosts and GPUs."""
    return f'{m(name)}{{{SEL}{", " + extra if extra else ""}}}'


def health(spec: Spec) -> list[Any]:
    return [
        targets_up((JOB_EXPORTER,)),
        stat_panel("NVML up", "short", q(f'min({m("inferwatch_nvml_up")}{{instance=~"$host"}})', "NVML"),
                   thresholds=[(None, "red"), (1, "green")], width=6),
        stat_panel("GPUs failing NVML", "short",
                   q(f'sum({g("inferwatch_gpu_device_failed")}) or vector(0)', "failing"),
                   thresholds=RED_FROM_ONE, width=6,
                   description="GPUs that do not answer NVML (lost, off the bus): GPUDeviceFailed pages after 1m."),
        alerts_firing(uids.GPUS, spec.alerts),
    ]


def busy() -> list[Any]:
    """How busy, from GPM: utilization says a kernel ran, these say how much of the GPU it
    used. A GPU without GPM (before Hopper, or the exporter's --no-gpm) has no series here:
    it is counted as such, never drawn as 0."""
    def activity(title: str, metric: str, description: str) -> object:
        return timeseries_panel(title, "percentunit", q(g(metric), GPU), width=5, description=description)

    return [
        activity("SM active", "inferwatch_gpu_sm_active_ratio", "Share of time at least one warp ran on an SM."),
        activity("SM occupancy", "inferwatch_gpu_sm_occupancy_ratio", "Warps resident against the SMs' maximum."),
        activity("Tensor cores active", "inferwatch_gpu_tensor_active_ratio",
                 "Share of cycles the tensor pipes ran: the honest 'how busy' of an LLM's matmuls."),
        activity("DRAM active", "inferwatch_gpu_dram_active_ratio",
                 "Share of cycles device memory was read or written: decode is bound by it."),
        stat_panel("GPUs without GPM", "short",
                   q(f'count({g("inferwatch_gpu_info")}) - (count({g("inferwatch_gpu_sm_active_ratio")}) '
                     f'or vector(0))', "without GPM"),
                   width=4, height=8,
                   description="GPUs whose activity NVML does not report (GPM needs Hopper or later and the "
                               "exporter's --gpm): their activity panels stay empty."),
    ]


def use() -> list[Any]:
    return [
        timeseries_panel("Utilization", "percentunit", q(g("inferwatch_gpu_utilization_ratio"), GPU), width=6,
                         description="Share of time a kernel ran: busy, not how busy the tensor cores were."),
        timeseries_panel("Idle share", "percentunit", q(f"{cost.GPU_IDLE}{{{SEL}}}", GPU), width=6,
                         description=f"Share of the last {cost.WINDOW} no kernel ran (1 - mean utilization), what "
                                     "the cost rules count as a GPU paid for that waits; a model's mean is on the "
                                     "serving dashboard's Cost row."),
        timeseries_panel("Memory busy", "percentunit", q(g("inferwatch_gpu_memory_utilization_ratio"), GPU),
                         width=6,
                         description="Share of time device memory was read or written: decode saturates it first."),
        timeseries_panel("Memory used", "bytes", q(g("inferwatch_gpu_memory_used_bytes"), GPU),
                         q(g("inferwatch_gpu_memory_total_bytes"), "total " + GPU), width=6),
        timeseries_panel("Power", "watt", q(g("inferwatch_gpu_power_watts"), GPU),
                         q(g("inferwatch_gpu_power_limit_watts"), "limit " + GPU), width=6),
        stat_panel("Energy in range", "joule",
                   q(f'sum(increase({g("inferwatch_gpu_energy_joules_total")}[$__range]))', "energy"), height=8),
        timeseries_panel("Temperatures", "celsius", q(g("inferwatch_gpu_temperature_celsius"), "die " + GPU),
                         q(g("inferwatch_gpu_memory_temperature_celsius"), "HBM " + GPU),
                         thresholds=[(None, "green"), (85, "orange"), (95, "red")], width=7),
        timeseries_panel("Clocks", "hertz", q(g("inferwatch_gpu_sm_clock_hertz"), "SM " + GPU),
                         q(g("inferwatch_gpu_memory_clock_hertz"), "memory " + GPU), width=7),
    ]


def errors() -> list[Any]:
    return [
        timeseries_panel("Throttle reasons active", "short",
                         q(or_zero(f'sum by (reason) ({g("inferwatch_gpu_throttle_active")}) > 0', "reason"),
                           "{{reason}}"),
                         description="GPUs held down by each clock-event reason, for the reasons active (of the "
                                     "driver's eleven); none: no GPU is held down."),
        timeseries_panel("ECC errors", "short",
                         q(f'sum by (type, scope) ({added_in_window(g("inferwatch_gpu_ecc_errors_total"), RATE)})',
                           "{{type}} {{scope}}"),
                         thresholds=[(None, "green"), (1, "red")]),
        timeseries_panel("Row remapping and page retirement", "short",
                         q(f'sum by (type) ({g("inferwatch_gpu_remapped_rows")})', "remapped {{type}}"),
                         q(f'sum({g("inferwatch_gpu_row_remap_pending")})', "remap pending"),
                         q(f'sum({g("inferwatch_gpu_row_remap_failure")})', "remap failed"),
                         q(f'sum({g("inferwatch_gpu_retired_pages")}) or vector(0)', "pages retired"),
                         q(f'sum({g("inferwatch_gpu_retired_pages_pending")}) or vector(0)', "retirement pending"),
                         description="Ampere and later remap rows; older GPUs retire pages. Pending: a reset or "
                                     "reboot applies it."),
        timeseries_panel("XID errors", "short",
                         q(or_zero(f'sum by (xid) ({added_in_window(g("inferwatch_gpu_xid_errors_total"), RATE)})',
                                   "xid"), "XID {{xid}}"),
                         thresholds=[(None, "green"), (1, "red")]),
        timeseries_panel("PCIe throughput", "Bps", q(g("inferwatch_gpu_pcie_tx_bytes_per_second"), "tx " + GPU),
                         q(g("inferwatch_gpu_pcie_rx_bytes_per_second"), "rx " + GPU)),
        timeseries_panel("NVLink throughput", "Bps",
                         q(f'sum by (instance, gpu) (rate({g("inferwatch_gpu_nvlink_tx_bytes_total")}[{RATE}]))',
                           "tx " + GPU),
                         q(f'sum by (instance, gpu) (rate({g("inferwatch_gpu_nvlink_rx_bytes_total")}[{RATE}]))',
                           "rx " + GPU)),
        *(timeseries_panel(what, "short",
                           q(or_zero(f'sum by (instance, gpu) ({added_in_window(g(metric), RATE)}) > 0', "gpu"), GPU),
                           thresholds=RED_FROM_ONE, width=4,
                           description=f"{what} per GPU, for the GPUs that had some: a rising count is a failing "
                                       f"{where} long before an XID.")
          for what, metric, where in (("PCIe replays", "inferwatch_gpu_pcie_replays_total", "riser or slot"),
                                      ("NVLink errors", "inferwatch_gpu_nvlink_errors_total",
                                       "cable or NVSwitch port"))),
        timeseries_panel("PCIe link width (of max)", "percentunit",
                         q(f'{g("inferwatch_gpu_pcie_link_width")} / {g("inferwatch_gpu_pcie_link_width_max")}', GPU),
                         thresholds=[(None, "red"), (1, "green")],
                         description="A link trained below its width (x8 of x16) halves host transfers."),
        timeseries_panel("Performance state", "short", q(g("inferwatch_gpu_performance_state"), GPU),
                         description="P0 is full performance; a busy GPU in P2 or higher is held down."),
    ]


def fleet(spec: Spec) -> list[Any]:
    """Every GPU against its peers and its links against their own past: what fails slowly,
    fleet-wide (the host and GPU variables do not narrow it: the peers are the fleet's)."""
    t = spec.thresholds
    nvlink = m("inferwatch_gpu_nvlink_errors_total")
    return [
        timeseries_panel("Below its peers (stragglers)", "percentunit",
                         q(or_zero(f"max by (model, host, gpu) ({stragglers.DEFICIT}) > {t.straggler_deficit / 2!r}",
                                   "gpu"), "{{model}} {{host}} gpu{{gpu}}"),
                         thresholds=[(None, "green"), (t.straggler_deficit, "red")], width=12,
                         description="How far each GPU's 5-minute mean is below the mean of the other GPUs of its "
                                     "model and kind, by the signal it lags most in (SM activity, utilization, SM "
                                     "clock, power), for the GPUs more than half the ticket's share below: a "
                                     "healthy fleet draws none. "
                                     f"GPUStraggler tickets past {t.straggler_deficit:.0%} and "
                                     f"{t.straggler_stddevs:g} standard deviations for 10m while the model is busy."),
        timeseries_panel("NVLink errors: last hour against the last day", "short",
                         q(or_zero(f"sum by (instance, gpu, link, type) (rate({nvlink}[1h]))\n/ sum by (instance, "
                                   f"gpu, link, type) (rate({nvlink}[1d])) > 0", "link"),
                           "{{instance}} gpu{{gpu}} link{{link}} {{type}}"),
                         thresholds=[(None, "green"), (t.nvlink_error_rise, "red")], width=6,
                         description="The last hour's error rate of each link and type over its rate of the last day: "
                                     "1 is a steady trickle. GPUNVLinkErrorsRising tickets past "
                                     f"{t.nvlink_error_rise:g} with {t.nvlink_errors_per_hour} errors in the hour."),
        timeseries_panel("PCIe link generation (of max)", "percentunit",
                         q(f'{g("inferwatch_gpu_pcie_link_generation")} / '
                           f'{g("inferwatch_gpu_pcie_link_generation_max")}', GPU),
                         thresholds=[(None, "red"), (1, "green")], width=6,
                         description="An idle GPU lowers its link's generation to save power; a busy one below 1 "
                                     "trained down (GPUPCIeLinkDegraded)."),
    ]


ALONE, SHARED = 'shared="false"', 'shared="true"'


def pods() -> list[Any]:
    """Which pod holds which GPU, from the kubelet (the exporter's pod-resources reading, or
    dcgm-exporter's pod labels through the compatibility rules). A GPU several containers
    share is theirs together: it counts for no pod's utilization."""
    held = f'group by (uuid, namespace, pod) ({g("inferwatch_gpu_pod_info")})'
    alone = f'group by (uuid, namespace, pod) ({g("inferwatch_gpu_pod_info", ALONE)})'
    return [
        timeseries_panel("GPUs per pod", "short", q(f"count by (namespace, pod) ({held})", "{{namespace}}/{{pod}}"),
                         width=6, description="GPUs each pod holds, whole, as a MIG device or a time-sliced share."),
        timeseries_panel("Utilization per pod", "percentunit",
                         q(f'avg by (namespace, pod) ({g("inferwatch_gpu_utilization_ratio")}\n'
                           f"* on (uuid) group_left (namespace, pod) {alone})", "{{namespace}}/{{pod}}"), width=6,
                         description="Mean utilization of the GPUs each pod holds alone. A shared GPU is left out: "
                                     "its utilization is its holders' together (docs/exporter.md)."),
        stat_panel("Shared GPUs", "short",
                   q(f'count(group by (uuid) ({g("inferwatch_gpu_pod_info", SHARED)})) or vector(0)',
                     "shared"), width=4, height=8,
                   description="GPUs several containers hold (time-slicing, MIG devices of one GPU): their "
                               "utilization, power and cost belong to none of them alone."),
        stat_panel("GPUs not allocatable", "short",
                   q(f'count({g("inferwatch_gpu_allocatable")} == 0) or vector(0)', "not allocatable"),
                   thresholds=RED_FROM_ONE, width=4, height=8,
                   description="GPUs NVML sees that the kubelet may not hand to a pod: their device plugin reports "
                               "them unhealthy (GPUNotAllocatable)."),
        stat_panel("Kubelet answers", "short", q(f'min({m("inferwatch_podresources_up")}{{instance=~"$host"}})',
                                                 "up"),
                   thresholds=[(None, "red"), (1, "green")], width=4, height=8,
                   description="1 while every exporter's last List of the kubelet's pod-resources API succeeded; "
                               "at 0 the last answer's pods are shown. No value: not on Kubernetes."),
    ]


def processes_and_health(spec: Spec) -> list[Any]:
    return [
        timeseries_panel("Memory per process", "bytes",
                         q(g("inferwatch_gpu_process_memory_used_bytes"), "{{process}} ({{pid}}) " + GPU),
                         description="Opt-in: the exporter's --processes.", width=12),
        stat_panel("Snapshot age", "s",
                   q(f'max(time() - {m("inferwatch_nvml_snapshot_timestamp_seconds")}{{instance=~"$host"}})', "age"),
                   thresholds=[(None, "green"), (spec.thresholds.snapshot_stale_s, "red")], height=8),
        stat_panel("Sampler duration", "s",
                   q(f'max({m("inferwatch_nvml_sampler_duration_seconds")}{{instance=~"$host"}})', "sampler"),
                   height=8),
        stat_panel("NVLinks down", "short",
                   q(f'count({g("inferwatch_gpu_nvlink_up")} == 0) or vector(0)', "down"),
                   thresholds=RED_FROM_ONE, height=8,
                   description="Links NVML reports disabled on GPUs that have NVLink: traffic falls back to PCIe."),
        timeseries_panel("Exporter query failures", "short",
                         q(or_zero(f'sum by (query) (rate({g("inferwatch_gpu_collection_errors_total")}[{RATE}]))',
                                   "query"), "{{query}}"),
                         q(f'sum(rate({m("inferwatch_nvml_sampler_errors_total")}{{instance=~"$host"}}[{RATE}]))',
                           "sampler"),
                         width=12, description="NVML queries failing per second, by query: a reading that stays "
                                               "empty on the panels above says why here."),
        timeseries_panel("NVML time per GPU", "s",
                         q(f'max without (query) ({g("inferwatch_gpu_nvml_call_seconds")})\n'
                           f'or {g("inferwatch_gpu_nvml_duration_seconds")}', GPU),
                         thresholds=[(None, "green"), (spec.thresholds.nvml_slow_s, "red")], width=8,
                         description="How long each GPU's NVML queries took in the last cycle or, while a call on it "
                                     "has hung for over a second, how long that call has run: GPUNVMLSlow tickets "
                                     "past the red line for 5m."),
    ]


# Exporter series on no panel, and why: settings a person reads once (inventory, not a time
# series to watch), duplicates of a panel's reading, or what an LLM server does not use.
NOT_ON_DASHBOARDS: dict[str, str] = {
    "inferwatch_gpu_graphics_active_ratio": "the same engine as Utilization, from GPM",
    "inferwatch_gpu_gpm_pcie_tx_bytes_per_second": "PCIe throughput shows the driver's counter",
    "inferwatch_gpu_gpm_pcie_rx_bytes_per_second": "PCIe throughput shows the driver's counter",
    "inferwatch_gpu_gpm_nvlink_tx_bytes_per_second": "NVLink throughput shows the link counters",
    "inferwatch_gpu_gpm_nvlink_rx_bytes_per_second": "NVLink throughput shows the link counters",
    "inferwatch_gpu_memory_free_bytes": "total minus used minus reserved, on Memory used",
    "inferwatch_gpu_memory_reserved_bytes": "the driver's fixed share, a setting",
    "inferwatch_gpu_temperature_threshold_celsius": "a setting; the panel's 85/95 °C lines stand for it",
    "inferwatch_gpu_power_limit_default_watts": "a setting; Power shows the limit in force",
    "inferwatch_gpu_power_limit_min_watts": "a setting; Power shows the limit in force",
    "inferwatch_gpu_power_limit_max_watts": "a setting; Power shows the limit in force",
    "inferwatch_gpu_sm_clock_max_hertz": "a setting; Clocks shows the clock in force",
    "inferwatch_gpu_memory_clock_max_hertz": "a setting; Clocks shows the clock in force",
    "inferwatch_gpu_ecc_enabled": "a setting (inventory)",
    "inferwatch_gpu_ecc_pending_enabled": "a setting (inventory)",
    "inferwatch_gpu_persistence_mode_enabled": "a setting (inventory)",
    "inferwatch_gpu_compute_mode": "a setting (inventory)",
    "inferwatch_gpu_mig_enabled": "a setting (inventory)",
    "inferwatch_gpu_mig_memory_used_bytes": "MIG instances: docs/exporter.md; no MIG panel yet",
    "inferwatch_gpu_mig_memory_total_bytes": "MIG instances: docs/exporter.md; no MIG panel yet",
    "inferwatch_gpu_nvlink_ecc_data_errors": "NVLink errors shows the link's error counters",
    "inferwatch_gpu_fan_speed_ratio": "data-center GPUs have no fan of their own (NVML: not supported)",
    "inferwatch_gpu_encoder_utilization_ratio": "video encoding: no LLM server uses it",
    "inferwatch_gpu_decoder_utilization_ratio": "video decoding: no LLM server uses it",
    "inferwatch_gpu_last_xid_timestamp_seconds": "XID errors shows when; GPUFatalXID pages",
    "inferwatch_nvml_info": "the driver and NVML versions (inventory)",
    "inferwatch_nvml_devices": "GPUs per host; the GPU variable lists them",
    "inferwatch_podresources_errors": "why the kubelet did not answer: Kubelet answers shows that it did not",
}


def build(spec: Spec) -> dash_b.Dashboard:
    info = m("inferwatch_gpu_info")
    return dashboard(
        uids.GPUS, "inferwatch / GPUs", "NVML exporter: utilization, saturation and errors per GPU.",
        # hosts from nvml_up, which an exporter serves even when NVML is down or finds no GPU
        [query_variable("host", "Host", f'label_values({m("inferwatch_nvml_up")}, instance)'),
         query_variable("gpu", "GPU", f'label_values({info}{{instance=~"$host"}}, gpu)')],
        [("Health", health(spec)), ("How busy (GPM)", busy()), ("Utilization and saturation", use()),
         ("Errors and links", errors()), ("Fleet: stragglers and degrading links", fleet(spec)),
         ("Pods (Kubernetes)", pods()),
         ("Processes and exporter health", processes_and_health(spec))])
