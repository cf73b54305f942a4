"""GPU check: the exporter's readings against nvidia-smi on a real GPU host.

Run on a machine with an NVIDIA driver (not collected by pytest; CI has no GPU):

    python tests/gpu/check_nvml_exporter.py [--load-seconds 6]

Needs nvidia-ml-py and prometheus-client; torch, where installed, puts the GPU under a
matmul load so that the GPM readings are compared busy, not only idle. Exits non-zero, with
a table of what disagreed, if a reading is off by more than its tolerance, or if a series
the GPU should have is missing (a field NVML cannot read counts as a failure unless the GPU
model is known not to have it, see ABSENT_ON). Readings that move between two reads get
tolerances; identities, totals, modes and limits must match exactly.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import pynvml
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.exporters.collector import CachedExposition, SnapshotStore
from inferwatch.exporters.metrics import SPECS, THROTTLE_REASONS
from inferwatch.exporters.sampler import Sampler
from inferwatch.exporters.xid import XidWatcher

MIB = 1024 * 1024


def mib(v: str) -> float:
    return float(v) * MIB


def mhz(v: str) -> float:
    return float(v) * 1e6


def percent(v: str) -> float:
    return float(v) / 100


def enabled(v: str) -> float:
    return 1.0 if v.strip().lower() == "enabled" else 0.0


# metric (with extra labels), nvidia-smi --query-gpu field, converter to our units, tolerance (abs, rel)
CHECKS: list[tuple[str, dict[str, str], str, Callable[[str], float], tuple[float, float]]] = [
    ("inferwatch_gpu_memory_total_bytes", {}, "memory.total", mib, (MIB, 0)),
    ("inferwatch_gpu_memory_used_bytes", {}, "memory.used", mib, (64 * MIB, 0.02)),
    ("inferwatch_gpu_memory_free_bytes", {}, "memory.free", mib, (64 * MIB, 0.02)),
    ("inferwatch_gpu_memory_reserved_bytes", {}, "memory.reserved", mib, (MIB, 0)),
    ("inferwatch_gpu_temperature_celsius", {}, "temperature.gpu", float, (3, 0)),
    ("inferwatch_gpu_memory_temperature_celsius", {}, "temperature.memory", float, (3, 0)),
    ("inferwatch_gpu_power_watts", {}, "power.draw", float, (30, 0.25)),
    ("inferwatch_gpu_power_limit_watts", {}, "enforced.power.limit", float, (1, 0)),
    ("inferwatch_gpu_power_limit_default_watts", {}, "power.default_limit", float, (1, 0)),
    ("inferwatch_gpu_power_limit_min_watts", {}, "power.min_limit", float, (1, 0)),
    ("inferwatch_gpu_power_limit_max_watts", {}, "power.max_limit", float, (1, 0)),
    ("inferwatch_gpu_sm_clock_hertz", {}, "clocks.sm", mhz, (300e6, 0)),
    ("inferwatch_gpu_sm_clock_max_hertz", {}, "clocks.max.sm", mhz, (1e6, 0)),
    ("inferwatch_gpu_memory_clock_hertz", {}, "clocks.mem", mhz, (1e6, 0.01)),
    ("inferwatch_gpu_performance_state", {}, "pstate", lambda v: float(v.strip().lstrip("P")), (2, 0)),
    ("inferwatch_gpu_utilization_ratio", {}, "utilization.gpu", percent, (0.5, 0)),
    ("inferwatch_gpu_pcie_link_generation_max", {}, "pcie.link.gen.max", float, (0, 0)),
    ("inferwatch_gpu_pcie_link_width", {}, "pcie.link.width.current", float, (0, 0)),
    ("inferwatch_gpu_pcie_link_width_max", {}, "pcie.link.width.max", float, (0, 0)),
    ("inferwatch_gpu_pcie_link_generation", {}, "pcie.link.gen.current", float, (1, 0)),  # drops at idle
    ("inferwatch_gpu_ecc_enabled", {}, "ecc.mode.current", enabled, (0, 0)),
    ("inferwatch_gpu_ecc_pending_enabled", {}, "ecc.mode.pending", enabled, (0, 0)),
    ("inferwatch_gpu_persistence_mode_enabled", {}, "persistence_mode", enabled, (0, 0)),
    ("inferwatch_gpu_ecc_errors_total", {"type": "corrected", "scope": "volatile"},
     "ecc.errors.corrected.volatile.total", float, (0, 0)),
    ("inferwatch_gpu_ecc_errors_total", {"type": "uncorrected", "scope": "volatile"},
     "ecc.errors.uncorrected.volatile.total", float, (0, 0)),
    ("inferwatch_gpu_ecc_errors_total", {"type": "corrected", "scope": "aggregate"},
     "ecc.errors.corrected.aggregate.total", float, (0, 0)),
    ("inferwatch_gpu_ecc_errors_total", {"type": "uncorrected", "scope": "aggregate"},
     "ecc.errors.uncorrected.aggregate.total", float, (0, 0)),
    ("inferwatch_gpu_remapped_rows", {"type": "correctable"}, "remapped_rows.correctable", float, (0, 0)),
    ("inferwatch_gpu_remapped_rows", {"type": "uncorrectable"}, "remapped_rows.uncorrectable", float, (0, 0)),
]
THRESHOLDS = {  # nvidia-smi -q -d TEMPERATURE line -> our threshold label
    "GPU Shutdown Temp": "shutdown", "GPU Slowdown Temp": "slowdown",
    "GPU Max Operating Temp": "gpu_max", "Memory Max Operating Temp": "memory_max",
}
# Series a GPU family does not have: NVML answers NotSupported, and that is right.
ABSENT_ON = {
    r"H100|H200|H800|H20|GH200|B200|B100|GB200": {
        "inferwatch_gpu_fan_speed_ratio", "inferwatch_gpu_retired_pages", "inferwatch_gpu_retired_pages_pending",
        "inferwatch_gpu_encoder_utilization_ratio"},
    r"A100|A30|A800": {"inferwatch_gpu_fan_speed_ratio", "inferwatch_gpu_retired_pages",
                       "inferwatch_gpu_retired_pages_pending", "inferwatch_gpu_encoder_utilization_ratio",
                       *(f"inferwatch_gpu_{n}" for n in ("sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio",
                                                          "dram_active_ratio", "graphics_active_ratio"))},
}
# Series that exist only in some states: MIG on, processes running, links, XIDs seen, errors.
CONDITIONAL = {"inferwatch_gpu_mig_memory_used_bytes", "inferwatch_gpu_mig_memory_total_bytes",
               "inferwatch_gpu_process_memory_used_bytes", "inferwatch_gpu_xid_errors",
               "inferwatch_gpu_last_xid_timestamp_seconds", "inferwatch_gpu_collection_errors",
               "inferwatch_gpu_nvlink_up", "inferwatch_gpu_nvlink_tx_bytes", "inferwatch_gpu_nvlink_rx_bytes",
               "inferwatch_gpu_nvlink_errors", "inferwatch_gpu_nvlink_ecc_data_errors",
               "inferwatch_gpu_gpm_nvlink_tx_bytes_per_second", "inferwatch_gpu_gpm_nvlink_rx_bytes_per_second",
               "inferwatch_gpu_nvml_call_seconds"}  # the watchdog's: only while a call has hung for a second


def run(*argv: str) -> str:
    return subprocess.run(["nvidia-smi", *argv], capture_output=True, text=True).stdout


def smi_field(field: str) -> dict[str, str] | None:
    """index -> raw value; None when this nvidia-smi does not know the field."""
    out = subprocess.run(["nvidia-smi", f"--query-gpu=index,{field}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return {row.split(",")[0].strip(): row.split(",", 1)[1].strip() for row in out.stdout.splitlines() if "," in row}


class Reading:
    def __init__(self, families: dict) -> None:
        self.families = families

    def get(self, name: str, gpu: str, **labels: str) -> list[float]:
        family = self.families.get(name.removesuffix("_total"))
        return [s.value for s in (family.samples if family else [])
                if s.name == name and s.labels.get("gpu") == gpu and all(s.labels.get(k) == v for k, v in labels.items())]


class Table:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failures = 0

    def row(self, gpu: str, what: str, ours: object, theirs: object, ok: bool | None) -> None:
        verdict = "not comparable" if ok is None else ("ok" if ok else "MISMATCH")
        self.failures += ok is False
        self.lines.append(f"| {gpu} | {what} | {ours} | {theirs} | {verdict} |")


def compare_fields(reading: Reading, gpus: list[str], table: Table) -> None:
    for metric, labels, field, convert, (abs_tol, rel_tol) in CHECKS:
        values = smi_field(field)
        for gpu in gpus:
            ours = reading.get(metric, gpu, **labels)
            what = metric + (str(labels) if labels else "")
            raw = None if values is None else values.get(gpu)
            if raw is None or raw.startswith("[") or raw in ("", "N/A"):
                # nvidia-smi cannot read it either: agreement is absence on both sides
                table.row(gpu, what, ours[0] if ours else "absent", raw or "unknown field",
                          None if values is None else not ours)
                continue
            theirs = convert(raw)
            table.row(gpu, what, ours[0] if ours else "absent", theirs,
                      bool(ours) and abs(ours[0] - theirs) <= max(abs_tol, rel_tol * abs(theirs)))


def compare_modes_and_limits(reading: Reading, gpus: list[str], table: Table) -> None:
    modes = smi_field("compute_mode") or {}
    reasons = smi_field("clocks_event_reasons.active") or smi_field("clocks_throttle_reasons.active") or {}
    temps = run("-q", "-d", "TEMPERATURE")
    blocks = re.split(r"\nGPU [0-9A-Fa-f:.]+\n", temps)[1:]
    for gpu in gpus:
        mode = modes.get(gpu, "").lower()
        ours = [s.labels["mode"] for s in reading.families["inferwatch_gpu_compute_mode"].samples
                if s.labels["gpu"] == gpu] if "inferwatch_gpu_compute_mode" in reading.families else []
        table.row(gpu, "compute_mode", ours, mode, ours == [mode])
        if gpu in reasons:
            mask = int(reasons[gpu], 16)
            active = {r for bit, r in THROTTLE_REASONS.items() if mask & bit}
            ours_active = {s.labels["reason"] for s in reading.families["inferwatch_gpu_throttle_active"].samples
                           if s.labels["gpu"] == gpu and s.value == 1}
            # idle and power cap flip within milliseconds; the hardware and thermal ones do not
            steady = active - {"gpu_idle", "sw_power_cap"}
            table.row(gpu, "clock-event reasons (steady ones)", sorted(ours_active - {"gpu_idle", "sw_power_cap"}),
                      sorted(steady), ours_active - {"gpu_idle", "sw_power_cap"} == steady)
        block = blocks[int(gpu)] if int(gpu) < len(blocks) else ""
        for line, label in THRESHOLDS.items():
            found = re.search(rf"{line}\s*:\s*(\d+) C", block)
            ours_t = reading.get("inferwatch_gpu_temperature_threshold_celsius", gpu, threshold=label)
            if found:
                table.row(gpu, f"temperature threshold {label}", ours_t, found[1],
                          ours_t == [float(found[1])])
            else:
                table.row(gpu, f"temperature threshold {label}", ours_t, "N/A", not ours_t)


def compare_nvlinks(reading: Reading, gpus: list[str], table: Table) -> None:
    status = run("nvlink", "-s")
    per_gpu = re.split(r"^GPU (\d+):", status, flags=re.M)[1:]
    links = {per_gpu[i]: per_gpu[i + 1] for i in range(0, len(per_gpu), 2)}
    for gpu in gpus:
        text = links.get(gpu, "")
        active = len(re.findall(r"Link \d+: [\d.]+ GB/s", text))
        total = len(re.findall(r"Link \d+:", text))
        ups = reading.get("inferwatch_gpu_nvlink_up", gpu)
        table.row(gpu, "NVLink links (active/total)", f"{int(sum(ups))}/{len(ups)}", f"{active}/{total}",
                  (int(sum(ups)), len(ups)) == (active, total))


def compare_energy(sampler: Sampler, gpus: list[str], table: Table, seconds: float) -> None:
    """Energy counter slope against power.draw sampled meanwhile: the counter is the integral."""
    def energy() -> dict[str, float]:
        snap = sampler.sample()
        return {labels[0]: v for labels, v in snap.samples.get("inferwatch_gpu_energy_joules", [])}

    start, t0, draws = energy(), time.monotonic(), []
    while time.monotonic() - t0 < seconds:
        draws.append(smi_field("power.draw") or {})
        time.sleep(0.2)
    end, elapsed = energy(), time.monotonic() - t0
    for gpu in gpus:
        if gpu not in start:
            table.row(gpu, "energy slope (W)", "absent", "", False)
            continue
        slope = (end[gpu] - start[gpu]) / elapsed
        samples = [float(d[gpu]) for d in draws if gpu in d and not d[gpu].startswith("[")]
        mean = sum(samples) / len(samples) if samples else float("nan")
        table.row(gpu, "energy slope (W) vs mean power.draw", round(slope, 1), round(mean, 1),
                  abs(slope - mean) <= max(30, 0.25 * mean))


def matmul_load(seconds: float) -> threading.Thread | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def work() -> None:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def compare_gpm(sampler: Sampler, gpus: list[str], table: Table, load_s: float) -> None:
    """Busy (torch matmul on GPU 0) and idle: GPM against nvidia-smi dmon's GPM columns, and
    the point of GPM: under a matmul load utilization is ~1 while SM and tensor activity say
    how much of the GPU works."""
    load = matmul_load(load_s)
    time.sleep(2 if load else 0)
    sampler.sample()
    time.sleep(1)
    snap = sampler.sample().samples
    dmon = run("dmon", "-c", "1", "--gpm-metrics", "2,5")  # SM util, any tensor util (%), Hopper drivers
    if load:
        load.join()
    rows = [line.split() for line in dmon.splitlines() if line.strip() and not line.startswith("#")]
    for gpu in gpus:
        ours = {name: v for name in ("inferwatch_gpu_sm_active_ratio", "inferwatch_gpu_tensor_active_ratio",
                                     "inferwatch_gpu_utilization_ratio")
                for labels, v in snap.get(name, []) if labels[0] == gpu}
        row = next((r for r in rows if r and r[0] == gpu), None)
        for pos, name in ((-2, "inferwatch_gpu_sm_active_ratio"), (-1, "inferwatch_gpu_tensor_active_ratio")):
            theirs = float(row[pos]) / 100 if row and row[pos].replace(".", "").isdigit() else None
            ok = None if theirs is None else (name in ours and abs(ours[name] - theirs) <= 0.15)
            table.row(gpu, f"{name} (dmon --gpm-metrics)", ours.get(name, "absent"),
                      theirs if theirs is not None else dmon.strip()[:60], ok)
        if load and gpu == "0" and "inferwatch_gpu_sm_active_ratio" in ours:
            table.row(gpu, "under matmul: utilization ~1, SM activity > 0.3, tensor > 0.1",
                      {k.split("_gpu_")[1]: round(v, 2) for k, v in ours.items()}, "",
                      ours["inferwatch_gpu_utilization_ratio"] > 0.9 and ours["inferwatch_gpu_sm_active_ratio"] > 0.3
                      and ours.get("inferwatch_gpu_tensor_active_ratio", 0) > 0.1)


def compare_presence(reading: Reading, gpus: list[str], names: dict[str, str], table: Table) -> None:
    """Every per-GPU series is there, unless the GPU model is known not to have it."""
    for gpu in gpus:
        absent_ok = set().union(*(v for k, v in ABSENT_ON.items() if re.search(k, names[gpu])))
        missing = sorted(s.name for s in SPECS if s.per_gpu and s.name not in CONDITIONAL | absent_ok
                         and not [x for x in reading.families.get(s.name, type("F", (), {"samples": []})).samples
                                  if x.labels.get("gpu") == gpu])
        table.row(gpu, "series NVML could not read (not known absent on this model)", missing, "[]", not missing)
        took = [x.value for x in reading.families["inferwatch_gpu_nvml_duration_seconds"].samples
                if x.labels.get("gpu") == gpu]
        table.row(gpu, "a healthy GPU's NVML queries of one cycle take under 0.1 s (GPUNVMLSlow: 1 s)", took, "< 0.1",
                  bool(took) and took[0] < 0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load-seconds", type=float, default=6.0)
    args = parser.parse_args()
    sampler = Sampler(pynvml, processes=True, slow_interval_s=0)
    if not sampler.start():
        print(f"NVML did not start: {sampler.reason}")
        return 2
    xid = XidWatcher(pynvml, {d.index: d.handle for d in sampler.devices}, {d.index: d.labels for d in sampler.devices})
    xid_ok = xid.start()
    sampler.sample()  # GPM needs two samples
    time.sleep(1)
    t0 = time.perf_counter()
    snapshot = sampler.sample()
    cycle = time.perf_counter() - t0
    exposition = CachedExposition(SnapshotStore(snapshot), xid)
    render_times = []
    for _ in range(50):
        t = time.perf_counter()
        text = exposition.render().decode()
        render_times.append(time.perf_counter() - t)
    reading = Reading({f.name: f for f in text_string_to_metric_families(text)})
    table = Table()
    identity = smi_field("uuid") or {}
    names = smi_field("name") or {}
    buses = smi_field("pci.bus_id") or {}
    gpus = sorted(identity, key=int)
    for gpu in gpus:
        info = [s.labels for s in reading.families["inferwatch_gpu_info"].samples if s.labels["gpu"] == gpu]
        ok = bool(info) and info[0]["uuid"] == identity[gpu] and info[0]["name"] == names[gpu] and \
            info[0]["pci_bus_id"].lower().endswith(buses[gpu].lower()[-12:])
        table.row(gpu, "identity", info[0] if info else "absent", (identity[gpu], names[gpu], buses[gpu]), ok)
    table.row("all", "GPUs", len(sampler.devices), len(gpus), len(sampler.devices) == len(gpus))
    compare_fields(reading, gpus, table)
    compare_modes_and_limits(reading, gpus, table)
    compare_nvlinks(reading, gpus, table)
    compare_presence(reading, gpus, names, table)
    compare_energy(sampler, gpus, table, seconds=3)
    compare_gpm(sampler, gpus, table, args.load_seconds)
    xids = reading.families.get("inferwatch_gpu_xid_errors")
    table.row("all", "XID events registered; XIDs counted since start", (xid_ok, len(xids.samples) if xids else 0),
              "(True, 0) unless the kernel log shows an XID meanwhile", xid_ok)
    print("| gpu | reading | exporter | nvidia-smi | verdict |\n|---|---|---|---|---|")
    print("\n".join(table.lines))
    render_times.sort()
    series = sum(len(f.samples) for f in reading.families.values())
    print(f"\n{len(gpus)} GPU(s), {series} series; sampler cycle {cycle * 1e3:.1f} ms (NVML calls included); "
          f"render median {render_times[25] * 1e3:.3f} ms (cached); {table.failures} failure(s)")
    xid.stop()
    sampler.stop()
    return 1 if table.failures else 0


if __name__ == "__main__":
    sys.exit(main())
