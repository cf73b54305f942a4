"""dcgm-exporter compatibility rules: valid, and through promtool on series shaped
like dcgm-exporter's default counters (names, labels, units), the same values read back in
inferwatch's names and units, and inferwatch's GPU alerts firing on them unchanged."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from inferwatch.alerts import cost, dcgm, stragglers
from inferwatch.alerts.catalog import series_of
from inferwatch.exporters.metrics import SPECS
from tests.alerts.promtool import RULE_FILES, Scenario, promtool_doc, run_promtool, selector
from tests.support.promql import metric_names

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024

# dcgm-exporter's default counters (etc/default-counters.csv): name -> (type, unit)
DEFAULT_COUNTERS = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "MHz"), "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "MHz"),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "C"), "DCGM_FI_DEV_GPU_TEMP": ("gauge", "C"),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "W"), "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "mJ"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", ""), "DCGM_FI_DEV_GPU_UTIL": ("gauge", "%"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "%"), "DCGM_FI_DEV_ENC_UTIL": ("gauge", "%"),
    "DCGM_FI_DEV_DEC_UTIL": ("gauge", "%"), "DCGM_FI_DEV_XID_ERRORS": ("gauge", "last XID"),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "MiB"), "DCGM_FI_DEV_FB_USED": ("gauge", "MiB"),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "MiB"), "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("counter", ""),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": ("gauge", ""), "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", ""),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", ""), "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", ""),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "ratio"), "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "ratio"),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", "ratio"), "DCGM_FI_PROF_PCIE_TX_BYTES": ("gauge", "B/s"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gauge", "B/s"),
}
# default counters with no inferwatch counterpart: a vGPU licence, and NVLink bandwidth
# summed over links and directions (inferwatch counts per link and direction)
UNMAPPED = {"DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"}


def dcgm_gpu(index: int, **extra: str) -> dict[str, str]:
    """The labels dcgm-exporter puts on a GPU's series (DCGM_FI_DRIVER_VERSION as a label)."""
    return {"job": "dcgm-exporter", "instance": "10.0.0.7:9400", "gpu": str(index),
            "UUID": f"GPU-{index}a2b3c4d-0000-1111-2222-333344445555", "pci_bus_id": f"00000000:{index + 1:02X}:00.0",
            "device": f"nvidia{index}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node-a",
            "DCGM_FI_DRIVER_VERSION": "550.54.15", **extra}


def ours(index: int) -> dict[str, str]:
    """The same GPU under inferwatch's labels."""
    d = dcgm_gpu(index)
    return {"job": d["job"], "instance": d["instance"], "gpu": d["gpu"], "uuid": d["UUID"],
            "name": d["modelName"], "pci_bus_id": d["pci_bus_id"]}


def compat_doc(tests: list[dict], with_alerts: bool = False) -> dict:
    files = [str(dcgm.OUT)] + ([str(f) for f in RULE_FILES] if with_alerts else [])
    return {"rule_files": files, "evaluation_interval": "1m", "tests": tests}


def test_promtool_accepts_the_rules():
    result = subprocess.run(["promtool", "check", "rules", str(dcgm.OUT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_default_counter_is_mapped_or_said_not_to_be_and_records_only_exported_names():
    sources = {n for r in dcgm.rules() for n in metric_names(r["expr"])}
    assert set(DEFAULT_COUNTERS) - sources == UNMAPPED
    exported = {s for spec in SPECS for s in series_of(spec.name, spec.kind)}
    assert {r["record"] for r in dcgm.rules()} <= exported


def test_default_counters_read_back_in_inferwatch_names_units_and_labels(tmp_path):
    g0, g1 = dcgm_gpu(0), dcgm_gpu(1)
    pod_a, pod_b = ({"pod": p, "namespace": "llm", "container": "vllm"} for p in ("vllm-a", "vllm-b"))
    values = {  # dcgm-exporter's units
        "DCGM_FI_DEV_SM_CLOCK": 1755, "DCGM_FI_DEV_MEM_CLOCK": 2619, "DCGM_FI_DEV_MEMORY_TEMP": 61,
        "DCGM_FI_DEV_GPU_TEMP": 52, "DCGM_FI_DEV_POWER_USAGE": 250.5, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 3,
        "DCGM_FI_DEV_GPU_UTIL": 87, "DCGM_FI_DEV_MEM_COPY_UTIL": 40, "DCGM_FI_DEV_ENC_UTIL": 0,
        "DCGM_FI_DEV_DEC_UTIL": 5, "DCGM_FI_DEV_FB_FREE": 80000, "DCGM_FI_DEV_FB_USED": 1000,
        "DCGM_FI_DEV_FB_RESERVED": 500, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 2, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.9, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.3,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.55, "DCGM_FI_PROF_PCIE_TX_BYTES": 1.5e8, "DCGM_FI_PROF_PCIE_RX_BYTES": 2.5e8,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0x44, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 123,
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
    }
    series = {selector(name, g0): f"{v}x10" for name, v in values.items()}
    series[selector("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", g0)] = "1000000+60000x10"  # mJ, 1 kW
    series[selector("DCGM_FI_DEV_XID_ERRORS", g0)] = "0 0 79x10"
    # GPU 1: the pod using it changes at 3m (the old series ends with a staleness marker, as a
    # scrape without it writes); the GPU's series must stay one series with the new value
    series[selector("DCGM_FI_DEV_POWER_USAGE", {**g1, **pod_a})] = "100 100 100 stale"
    series[selector("DCGM_FI_DEV_POWER_USAGE", {**g1, **pod_b})] = "_ _ _ 90x8"
    series[selector("DCGM_FI_DEV_GPU_TEMP", g1)] = "40x10"
    series[selector("DCGM_FI_DEV_FB_USED", g1)] = "2000x10"  # an older dcgm-exporter: no FB_RESERVED
    series[selector("DCGM_FI_DEV_FB_FREE", g1)] = "79000x10"
    series[selector("DCGM_FI_DEV_XID_ERRORS", g1)] = "0x10"
    # a MIG instance of GPU 0: not the GPU, left out
    series[selector("DCGM_FI_DEV_POWER_USAGE", {**g0, "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "1"})] = "5x10"
    series[selector("up", {"job": "dcgm-exporter", "instance": "10.0.0.7:9400"})] = "1x10"  # Prometheus's own

    def at(expr: str, *samples: tuple[dict[str, str], float]) -> dict:
        return {"expr": expr, "eval_time": "5m", "exp_samples": [
            {"labels": selector(expr.split("{")[0], labels), "value": value} for labels, value in samples]}

    g0_ours, g1_ours = ours(0), ours(1)
    expectations = [
        at("inferwatch_gpu_sm_clock_hertz", (g0_ours, 1755e6)),
        at("inferwatch_gpu_memory_clock_hertz", (g0_ours, 2619e6)),
        at("inferwatch_gpu_memory_temperature_celsius", (g0_ours, 61)),
        at("inferwatch_gpu_temperature_celsius", (g0_ours, 52), (g1_ours, 40)),
        at("inferwatch_gpu_power_watts", (g0_ours, 250.5), (g1_ours, 90)),
        at("inferwatch_gpu_energy_joules_total", (g0_ours, 1000 + 5 * 60)),
        at("inferwatch_gpu_pcie_replays_total", (g0_ours, 3)),
        at("inferwatch_gpu_utilization_ratio", (g0_ours, 0.87)),
        at("inferwatch_gpu_memory_utilization_ratio", (g0_ours, 0.40)),
        at("inferwatch_gpu_encoder_utilization_ratio", (g0_ours, 0)),
        at("inferwatch_gpu_decoder_utilization_ratio", (g0_ours, 0.05)),
        at("inferwatch_gpu_memory_used_bytes", (g0_ours, 1000 * MIB), (g1_ours, 2000 * MIB)),
        at("inferwatch_gpu_memory_free_bytes", (g0_ours, 80000 * MIB), (g1_ours, 79000 * MIB)),
        at("inferwatch_gpu_memory_reserved_bytes", (g0_ours, 500 * MIB)),
        at("inferwatch_gpu_memory_total_bytes", (g0_ours, 81500 * MIB), (g1_ours, 81000 * MIB)),
        at("inferwatch_gpu_remapped_rows", ({**g0_ours, "type": "correctable"}, 2),
           ({**g0_ours, "type": "uncorrectable"}, 0)),
        at("inferwatch_gpu_row_remap_failure", (g0_ours, 0)),
        at("inferwatch_gpu_graphics_active_ratio", (g0_ours, 0.9)),
        at("inferwatch_gpu_tensor_active_ratio", (g0_ours, 0.3)),
        at("inferwatch_gpu_dram_active_ratio", (g0_ours, 0.55)),
        at("inferwatch_gpu_gpm_pcie_tx_bytes_per_second", (g0_ours, 1.5e8)),
        at("inferwatch_gpu_gpm_pcie_rx_bytes_per_second", (g0_ours, 2.5e8)),
        at("inferwatch_gpu_pcie_tx_bytes_per_second", (g0_ours, 1.5e8)),
        at('inferwatch_gpu_throttle_active{reason=~"sw_power_cap|hw_thermal_slowdown|hw_slowdown|gpu_idle"}',
           ({**g0_ours, "reason": "gpu_idle"}, 0), ({**g0_ours, "reason": "sw_power_cap"}, 1),
           ({**g0_ours, "reason": "hw_slowdown"}, 0), ({**g0_ours, "reason": "hw_thermal_slowdown"}, 1)),
        at("inferwatch_gpu_xid_errors_total", ({**g0_ours, "xid": "79"}, 1)),
        at("inferwatch_gpu_info", (g0_ours, 1), (g1_ours, 1)),
        at("inferwatch_nvml_up", ({"job": "dcgm-exporter", "instance": "10.0.0.7:9400"}, 1)),
        at("inferwatch_nvml_devices", ({"job": "dcgm-exporter", "instance": "10.0.0.7:9400"}, 2)),
    ]
    test = {"name": "dcgm-exporter default counters", "interval": "1m",
            "input_series": [{"series": k, "values": v} for k, v in series.items()],
            "promql_expr_test": expectations}
    result = run_promtool(compat_doc([test]), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_inferwatch_gpu_alerts_fire_unchanged_on_dcgm_exporter_series(tmp_path):
    g0 = dcgm_gpu(0)

    def crit(**labels: str) -> dict[str, str]:
        return {**ours(0), **labels, "severity": "critical"}

    scenarios = [
        Scenario("XID 79 as dcgm-exporter's last-XID gauge", "GPUFatalXID",
                 {selector("DCGM_FI_DEV_XID_ERRORS", {**g0, "err_code": "79", "err_msg": "GPU has fallen off the bus"}):
                  "_ _ _ _ _ 79x20", selector("DCGM_FI_DEV_GPU_TEMP", g0): "50x25"},
                 quiet_at=("4m",), fires_at="6m", labels=crit(xid="79", action="reboot_node"), value="1", resolved_at="17m"),
        Scenario("row remap failure", "GPURowRemapFailure",
                 {selector("DCGM_FI_DEV_ROW_REMAP_FAILURE", g0): "0 0 1 1 1 0 0 0"},
                 quiet_at=("1m",), fires_at="3m", labels=crit(), value="1", resolved_at="7m"),
        Scenario("uncorrectable ECC (a counter enabled in dcgm-exporter's file)", "GPUUncorrectableECC",
                 {selector("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", g0): "0 0 2 2x20"},
                 quiet_at=("1m",), fires_at="3m", labels=crit(type="uncorrected", scope="volatile"), value="2",
                 resolved_at="14m"),
        Scenario("thermal slowdown in the clock-event bitmask", "GPUThrottled",
                 {selector("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", g0): "4 68x20 4"},
                 quiet_at=("10m",), fires_at="17m",
                 labels={**{k: ours(0)[k] for k in ("instance", "gpu", "uuid")}, "reason": "hw_thermal_slowdown",
                         "severity": "warning"},
                 value="1", resolved_at="23m"),
    ]
    # promtool evaluates the recording group and the alert groups in no fixed order, as
    # Prometheus runs groups on their own schedules: an alert may read a recorded series one
    # evaluation late, so each check is placed where either order gives the same answer
    doc = promtool_doc(scenarios)
    result = run_promtool(compat_doc(doc["tests"], with_alerts=True), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_gpu_dashboard_reads_what_the_rules_record_except_what_dcgm_exporter_lacks():
    dashboard = json.loads((ROOT / "dashboards" / "json" / "inferwatch-gpus.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
              for v in dashboard["templating"]["list"] if v.get("type") == "query"]
    read = {n for e in exprs for n in metric_names(e) if n.startswith("inferwatch_")}
    recorded = {r["record"] for r in dcgm.rules()}
    # the cost rules' per-GPU records read only GPU series the compatibility rules record
    # and so do the stragglers' (alerts/stragglers.py)
    derived = (*cost.records(), *stragglers.records())
    derived_names = {r.name for r in derived}
    assert {n for r in derived for n in metric_names(r.expr) if n.startswith("inferwatch_gpu_")} <= recorded
    assert read - recorded - derived_names == dcgm.NOT_FROM_DCGM


# Kubernetes labels a dcgm-exporter series can carry, all of which change with the pod
# using the GPU (or with the dcgm-exporter pod): its own pod attribution (pod, namespace,
# container, pod_uid), vgpu, and, behind its Helm chart's ServiceMonitor (honorLabels
# false), the same attribution renamed exported_* because the scrape sets pod/namespace.
POD_A = {"pod": "vllm-a", "namespace": "llm", "container": "vllm", "pod_uid": "1111"}
POD_B = {"pod": "vllm-b", "namespace": "llm", "container": "vllm", "pod_uid": "2222"}
EXPORTED_A = {"exported_pod": "vllm-a", "exported_namespace": "llm", "exported_container": "vllm",
              "pod": "dcgm-exporter-x", "namespace": "gpu-operator"}
EXPORTED_B = {**EXPORTED_A, "exported_pod": "vllm-b"}


def quiet(alert: str, *times: str) -> list[dict]:
    return [{"eval_time": t, "alertname": alert, "exp_alerts": []} for t in times]


def pod_change(name: str, old: dict[str, str], new: dict[str, str], before: str, after: str) -> dict[str, str]:
    """GPU 0's ``name`` under pod ``old`` until 15m, then under ``new``: the old series ends
    with a staleness marker, as Prometheus writes when a series leaves a scrape."""
    return {selector(name, {**dcgm_gpu(0), **old}): f"{before} stale",
            selector(name, {**dcgm_gpu(0), **new}): f"_x15 {after}"}


LATER = tuple(f"{m}m" for m in range(12, 31, 2))  # from 2m before the change to 15m after


def test_a_pod_change_does_not_page_an_old_xid_again_nor_split_a_series(tmp_path):
    """The XID and ECC alerts look for a series that is new and non-zero: a GPU's last XID
    or ECC total reappearing under another pod's labels must not look new."""
    gpu = ours(0)
    tests = []
    for case, (old, new) in {"pod attribution": (POD_A, POD_B), "exported_* behind a ServiceMonitor":
                             (EXPORTED_A, EXPORTED_B)}.items():
        series = {**pod_change("DCGM_FI_DEV_XID_ERRORS", old, new, "79x14", "79x15"),
                  **pod_change("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", old, new, "2x14", "2x15"),
                  **pod_change("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", old, new, "0+60000x14", "900000+60000x15")}
        tests.append({
            "name": f"pod change ({case})", "interval": "1m",
            "input_series": [{"series": k, "values": v} for k, v in series.items()],
            "alert_rule_test": quiet("GPUFatalXID", *LATER) + quiet("GPUUncorrectableECC", *LATER),
            "promql_expr_test": [
                {"expr": "inferwatch_gpu_xid_errors_total", "eval_time": t,
                 "exp_samples": [{"labels": selector("inferwatch_gpu_xid_errors_total", {**gpu, "xid": "79"}),
                                  "value": 1}]} for t in ("14m", "15m", "16m")] + [
                {"expr": "increase(inferwatch_gpu_energy_joules_total[5m])", "eval_time": t,
                 "exp_samples": [{"labels": selector("", gpu), "value": 300}]} for t in ("14m", "17m", "20m")],
        })
    result = run_promtool(compat_doc(tests, with_alerts=True), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pods_sharing_a_gpu_count_one_xid_once(tmp_path):
    """Time-sliced pods on one GPU: dcgm-exporter writes the GPU's last XID once per pod.
    The XID is one, and one pod leaving is no new XID."""
    gpu = ours(0)
    series = {selector("DCGM_FI_DEV_XID_ERRORS", {**dcgm_gpu(0), **POD_A}): "13x40",
              selector("DCGM_FI_DEV_XID_ERRORS", {**dcgm_gpu(0), **POD_B}): "13x19 stale"}
    test = {"name": "shared GPU", "interval": "1m",
            "input_series": [{"series": k, "values": v} for k, v in series.items()],
            "alert_rule_test": quiet("GPUXIDError", *(f"{m}m" for m in range(12, 31, 1))),
            "promql_expr_test": [
                {"expr": "inferwatch_gpu_xid_errors_total", "eval_time": t,
                 "exp_samples": [{"labels": selector("inferwatch_gpu_xid_errors_total", {**gpu, "xid": "13"}),
                                  "value": 1}]} for t in ("5m", "19m", "21m")]}
    result = run_promtool(compat_doc([test], with_alerts=True), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_dcgm_cluster_raises_no_exporter_guard_with_the_job_configured_empty_or_not_at_all(tmp_path):
    """GPU metrics from dcgm-exporter satisfy the inferwatch-exporter guards: a cluster that runs
    it instead of ours opens no ticket, whether it keeps an empty inferwatch-exporter job or
    has none. Without any GPU metrics and without the job, the guard fires."""
    guards = [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]
              if r.get("alert", "").startswith("Inferwatch") and r["alert"].endswith("Absent")
              and r["labels"].get("job") == "inferwatch-exporter"]
    assert {r["labels"]["metric"] for r in guards} == {"up", "inferwatch_nvml_up"}
    dcgm_series = {selector("DCGM_FI_DEV_GPU_TEMP", dcgm_gpu(0)): "50x30"}
    no_targets = selector("prometheus_sd_discovered_targets",
                          {"config": "inferwatch-exporter", "name": "scrape", "job": "prometheus",
                           "instance": "localhost:9090"})

    def case(name: str, series: dict[str, str], fires: set[str]) -> dict:
        return {"name": name, "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "promql_expr_test": [{"expr": r["expr"], "eval_time": "20m",
                                      "exp_samples": [{"labels": "{}", "value": 1}]
                                      if r["labels"]["metric"] in fires else []} for r in guards]}

    tests = [case("exporter job with no targets", {**dcgm_series, no_targets: "0x30"}, set()),
             case("exporter job removed", dcgm_series, set()),
             case("no GPU metrics and no exporter job", {selector("up", {"job": "vllm", "instance": "v:8000"}):
                                                         "1x30"}, {"up"})]
    result = run_promtool(compat_doc(tests, with_alerts=True), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_dead_dcgm_exporter_on_a_gpu_node_opens_nvmldown(tmp_path):
    g0 = dcgm_gpu(0)
    target = {"job": g0["job"], "instance": g0["instance"]}
    scenario = Scenario("dcgm-exporter stops answering", "NVMLDown",
                        {selector("up", target): "1x10 0x20", selector("DCGM_FI_DEV_GPU_TEMP", g0): "50x10 _x20",
                         selector("up", {"job": "dcgm-exporter", "instance": "cpu-node:9400"}): "1x10 0x20"},
                        quiet_at=("9m", "13m"), fires_at="17m", labels={**target, "severity": "warning"}, value="0")
    result = run_promtool(compat_doc(promtool_doc([scenario])["tests"], with_alerts=True), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_pods_dcgm_exporter_names_become_inferwatchs_pod_series_in_either_spelling(tmp_path):
    """A pod on GPU 0 as dcgm-exporter writes it (honorLabels), one on GPU 1 renamed
    ``exported_*`` by a monitor without it (whose own pod is dcgm-exporter's), one on a MIG
    device of GPU 1, and GPU 2 held by no pod: what the scrape's own pod labels say of it
    (dcgm-exporter's pod) is no holder."""
    scrape = {"pod": "dcgm-exporter-x", "namespace": "gpu-operator", "container": "exporter"}
    target = {"job": "dcgm-exporter", "instance": "10.0.0.7:9400", **scrape}
    series = {selector("DCGM_FI_DEV_GPU_TEMP", dcgm_gpu(0, **POD_A)): "40x10",
              selector("DCGM_FI_DEV_GPU_TEMP", dcgm_gpu(1, **EXPORTED_B)): "40x10",
              selector("DCGM_FI_DEV_GPU_TEMP", dcgm_gpu(1, GPU_I_ID="3", GPU_I_PROFILE="1g.10gb",
                                                        exported_pod="small", exported_namespace="llm",
                                                        exported_container="vllm", **scrape)): "40x10",
              selector("DCGM_FI_DEV_GPU_TEMP", dcgm_gpu(2, **scrape)): "40x10",
              selector("up", target): "1x10"}

    def held(index: int, pod: str) -> dict:
        return {"labels": selector("inferwatch_gpu_pod_info", {**ours(index), "pod": pod, "namespace": "llm",
                                                               "container": "vllm"}), "value": 1}

    test = {"name": "pod series from dcgm-exporter", "interval": "1m",
            "input_series": [{"series": k, "values": v} for k, v in series.items()],
            "promql_expr_test": [{"expr": "inferwatch_gpu_pod_info", "eval_time": "5m",
                                  "exp_samples": [held(0, "vllm-a"), held(1, "vllm-b"), held(1, "small")]}]}
    result = run_promtool(compat_doc([test]), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
