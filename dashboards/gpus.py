"""GPUs, the USE side: utilization, saturation (throttling, memory), errors (ECC, XID)."""

from __future__ import annotations

from inferwatch.dashboards import uids
from inferwatch.dashboards.panels import RATE, dashboard, or_zero, q, query_variable, stat_panel, timeseries_panel
from inferwatch.alerts.spec import SNAPSHOT_STALE_S
from inferwatch.catalog import metric as m

SEL = 'instance=~"$host", gpu=~"$gpu"'
GPU = "{{instance}} gpu{{gpu}}"


def g(name: str, extra: str = "") -> str:
    """A per-GPU series on the selected hosts and GPUs."""
    return f'{m(name)}{{{SEL}{", " + extra if extra else ""}}}'


def use() -> list:
    return [
        timeseries_panel("Utilization", "percentunit", q(g("inferwatch_gpu_utilization_ratio"), GPU),
                         description="Share of time a kernel ran: busy, not how busy the tensor cores were."),
        timeseries_panel("Memory used", "bytes", q(g("inferwatch_gpu_memory_used_bytes"), GPU),
                         q(g("inferwatch_gpu_memory_total_bytes"), "total " + GPU)),
        timeseries_panel("Power", "watt", q(g("inferwatch_gpu_power_watts"), GPU),
                         q(g("inferwatch_gpu_power_limit_watts"), "limit " + GPU)),
        stat_panel("Energy in range", "joule",
                   q(f'sum(increase({g("inferwatch_gpu_energy_joules_total")}[$__range]))', "energy"), height=8),
        timeseries_panel("Temperatures", "celsius", q(g("inferwatch_gpu_temperature_celsius"), "die " + GPU),
                         q(g("inferwatch_gpu_memory_temperature_celsius"), "HBM " + GPU),
                         thresholds=[(None, "green"), (85, "orange"), (95, "red")], width=10),
        timeseries_panel("Clocks", "hertz", q(g("inferwatch_gpu_sm_clock_hertz"), "SM " + GPU),
                         q(g("inferwatch_gpu_memory_clock_hertz"), "memory " + GPU), width=10),
    ]


def errors() -> list:
    return [
        timeseries_panel("Throttle reasons active", "short",
                         q(f'sum by (reason) ({g("inferwatch_gpu_throttle_active")})', "{{reason}}"),
                         description="GPUs held down by each clock-event reason (0 = none)."),
        timeseries_panel("ECC errors", "short",
                         q(f'sum by (type, scope) (increase({g("inferwatch_gpu_ecc_errors_total")}[{RATE}]))',
                           "{{type}} {{scope}}"),
                         thresholds=[(None, "green"), (1, "red")]),
        timeseries_panel("Row remapping", "short",
                         q(f'sum by (type) ({g("inferwatch_gpu_remapped_rows")})', "remapped {{type}}"),
                         q(f'sum({g("inferwatch_gpu_row_remap_pending")})', "pending"),
                         q(f'sum({g("inferwatch_gpu_row_remap_failure")})', "failed")),
        timeseries_panel("XID errors", "short",
                         q(or_zero(f'sum by (xid) (increase({g("inferwatch_gpu_xid_errors_total")}[{RATE}]))', "xid"),
                           "XID {{xid}}"),
                         thresholds=[(None, "green"), (1, "red")]),
        timeseries_panel("PCIe throughput", "Bps", q(g("inferwatch_gpu_pcie_tx_bytes_per_second"), "tx " + GPU),
                         q(g("inferwatch_gpu_pcie_rx_bytes_per_second"), "rx " + GPU)),
        timeseries_panel("NVLink throughput", "Bps",
                         q(f'sum by (instance, gpu) (rate({g("inferwatch_gpu_nvlink_tx_bytes_total")}[{RATE}]))',
                           "tx " + GPU),
                         q(f'sum by (instance, gpu) (rate({g("inferwatch_gpu_nvlink_rx_bytes_total")}[{RATE}]))',
                           "rx " + GPU)),
    ]


def processes_and_health() -> list:
    return [
        timeseries_panel("Memory per process", "bytes",
                         q(g("inferwatch_gpu_process_memory_used_bytes"), "{{process}} ({{pid}}) " + GPU),
                         description="Opt-in: the exporter's --processes.", width=12),
        stat_panel("NVML up", "short", q(f'min({m("inferwatch_nvml_up")}{{instance=~"$host"}})', "NVML"),
                   thresholds=[(None, "red"), (1, "green")], height=8),
        stat_panel("Snapshot age", "s",
                   q(f'max(time() - {m("inferwatch_nvml_snapshot_timestamp_seconds")}{{instance=~"$host"}})', "age"),
                   thresholds=[(None, "green"), (SNAPSHOT_STALE_S, "red")], height=8),
        stat_panel("Sampler duration", "s",
                   q(f'max({m("inferwatch_nvml_sampler_duration_seconds")}{{instance=~"$host"}})', "sampler"),
                   height=8),
    ]


def build():
    info = m("inferwatch_gpu_info")
    return dashboard(
        uids.GPUS, "inferwatch / GPUs", "NVML exporter: utilization, saturation and errors per GPU.",
        # hosts from nvml_up, which an exporter serves even when NVML is down or finds no GPU
        [query_variable("host", "Host", f'label_values({m("inferwatch_nvml_up")}, instance)'),
         query_variable("gpu", "GPU", f'label_values({info}{{instance=~"$host"}}, gpu)')],
        [("Utilization and saturation", use()), ("Errors and links", errors()),
         ("Processes and exporter health", processes_and_health())])
