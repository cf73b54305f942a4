"""GPU check: the exporter's readings against nvidia-smi on a real GPU host.

Run on a machine with an NVIDIA driver (not collected by pytest; CI has no GPU):

    python tests/gpu/check_nvml_exporter.py

Needs nvidia-ml-py and prometheus-client only. Exits non-zero, with a table of what
disagreed, if any reading is off by more than its tolerance. Readings that move between
the two reads (utilization, power, clocks under boost) get tolerances; identities and
totals must match exactly.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import pynvml  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from exporters.collector import CachedExposition, SnapshotStore  # noqa: E402
from exporters.sampler import Sampler  # noqa: E402
from exporters.xid import XidWatcher  # noqa: E402

FIELDS = ["index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "temperature.gpu", "power.draw",
          "power.limit", "clocks.sm", "clocks.max.sm", "clocks.mem", "pstate", "utilization.gpu"]
MIB = 1024 * 1024

# metric, nvidia-smi field, converter from nvidia-smi's units to ours, tolerance (abs, rel)
CHECKS = [
    ("inferwatch_gpu_memory_total_bytes", "memory.total", lambda v: float(v) * MIB, (MIB, 0)),
    ("inferwatch_gpu_memory_used_bytes", "memory.used", lambda v: float(v) * MIB, (64 * MIB, 0.02)),
    ("inferwatch_gpu_temperature_celsius", "temperature.gpu", float, (3, 0)),
    ("inferwatch_gpu_power_watts", "power.draw", float, (30, 0.25)),
    ("inferwatch_gpu_power_limit_watts", "power.limit", float, (1, 0)),
    ("inferwatch_gpu_sm_clock_hertz", "clocks.sm", lambda v: float(v) * 1e6, (300e6, 0)),
    ("inferwatch_gpu_sm_clock_max_hertz", "clocks.max.sm", lambda v: float(v) * 1e6, (1e6, 0)),
    ("inferwatch_gpu_memory_clock_hertz", "clocks.mem", lambda v: float(v) * 1e6, (1e6, 0.01)),
    ("inferwatch_gpu_performance_state", "pstate", lambda v: float(v.strip().lstrip("P")), (2, 0)),
    ("inferwatch_gpu_utilization_ratio", "utilization.gpu", lambda v: float(v) / 100, (0.5, 0)),
]


def smi() -> list[dict[str, str]]:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return [dict(zip(FIELDS, (c.strip() for c in row))) for row in csv.reader(io.StringIO(out)) if row]


def main() -> int:
    sampler = Sampler(pynvml, processes=True, slow_interval_s=0)
    if not sampler.start():
        print(f"NVML did not start: {sampler.reason}")
        return 2
    xid = XidWatcher(pynvml, {d.index: d.handle for d in sampler.devices}, {d.index: d.labels for d in sampler.devices})
    xid_ok = xid.start()
    t0 = time.perf_counter()
    snapshot = sampler.sample()
    cycle = time.perf_counter() - t0
    exposition = CachedExposition(SnapshotStore(snapshot), xid)
    render_times = []
    for _ in range(50):
        t = time.perf_counter()
        text = exposition.render().decode()
        render_times.append(time.perf_counter() - t)
    rows = smi()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    failures, lines = 0, []
    for gpu in rows:
        idx = gpu["index"]
        info = [s for s in families["inferwatch_gpu_info"].samples if s.labels["gpu"] == idx][0].labels
        ident_ok = (info["uuid"] == gpu["uuid"] and info["name"] == gpu["name"]
                    and info["pci_bus_id"].lower().endswith(gpu["pci.bus_id"].lower()[-12:]))
        failures += not ident_ok
        lines.append(f"| {idx} | identity | {info['uuid']} {info['name']} | {gpu['uuid']} {gpu['name']} | "
                     f"{'ok' if ident_ok else 'MISMATCH'} |")
        for metric, field, convert, (abs_tol, rel_tol) in CHECKS:
            ours = [s.value for s in families.get(metric, type("F", (), {"samples": []})).samples
                    if s.labels.get("gpu") == idx]
            raw = gpu[field]
            if raw in ("[N/A]", "[Not Supported]", ""):
                lines.append(f"| {idx} | {metric} | {ours[0] if ours else 'absent'} | {raw} | skipped |")
                continue
            theirs = convert(raw)
            ok = bool(ours) and abs(ours[0] - theirs) <= max(abs_tol, rel_tol * abs(theirs))
            failures += not ok
            lines.append(f"| {idx} | {metric} | {ours[0] if ours else 'absent'} | {theirs} | "
                         f"{'ok' if ok else 'MISMATCH'} |")
    print("| gpu | reading | exporter | nvidia-smi | verdict |\n|---|---|---|---|---|")
    print("\n".join(lines))
    render_times.sort()
    series = sum(len(f.samples) for f in families.values())
    print(f"\n{len(rows)} GPU(s), {series} series; sampler cycle {cycle * 1e3:.1f} ms (NVML calls included); "
          f"render median {render_times[25] * 1e3:.3f} ms (cached); XID events registered: {xid_ok}")
    xid.stop()
    sampler.stop()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
