"""NVML exporter costs with 8 fake GPUs: scrape render, sampler overhead, RSS and CPU.

Baselines in the same run: rendering without the cache, the common design that calls
NVML inside collect() on every scrape, and the exporter with GPM (Hopper profiling
metrics, two NVML samples per GPU and cycle) off against on. NVML call time itself is the fake's (microseconds);
on real GPUs each call costs 10 µs to milliseconds, which is why the sampler's own
overhead is reported with NVML time subtracted, and why scrapes must never call NVML.

    python bench/exporter.py [--gpus 8] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.registry import Collector  # noqa: E402

from bench.procs import running  # noqa: E402
from inferwatch.exporters.collector import CachedExposition, NvmlCollector, SnapshotStore  # noqa: E402
from inferwatch.exporters.sampler import Sampler  # noqa: E402
from tests.support.clock import Clock  # noqa: E402
from tests.support.fleet import fleet  # noqa: E402
from tests.support.sockets import free_port  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


class TimedNVML:
    """Wraps an NVML module and adds up the time spent inside its calls."""

    def __init__(self, nvml) -> None:
        self._nvml = nvml
        self.inside = 0.0

    def __getattr__(self, name):
        attr = getattr(self._nvml, name)
        if not (callable(attr) and name.startswith("nvml")):
            return attr

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.inside += time.perf_counter() - t0

        return timed


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def sampler_cycles(gpus: int, gpm: bool, cycles: int) -> tuple[list[float], list[float]]:
    """(total, own overhead) seconds per cycle. The cycles run back to back, but the clock GPM
    spaces its samples by moves one default interval (1 s) per cycle, so that every cycle
    takes its GPM sample as it does in the exporter (GPM waits 100 ms between samples)."""
    clock = Clock()
    nvml = TimedNVML(fleet(gpus, clock=clock))
    sampler = Sampler(nvml, gpm=gpm, monotonic=clock)
    sampler.start()
    totals, overheads = [], []
    for _ in range(cycles):
        clock.now += 1.0
        nvml.inside = 0.0
        t0 = time.perf_counter()
        sampler.sample()
        total = time.perf_counter() - t0
        totals.append(total)
        overheads.append(total - nvml.inside)
    return totals, overheads


def sampler_rows(gpus: int, cycles: int = 300) -> list[str]:
    off_totals, off_overheads = sampler_cycles(gpus, False, cycles)
    totals, overheads = sampler_cycles(gpus, True, cycles)
    ratio = statistics.median(overheads) / statistics.median(off_overheads)
    return [f"| sampler cycle, total (fake NVML), GPM on | {statistics.median(totals) * 1e3:.3f} ms | "
            f"{pct(totals, 0.99) * 1e3:.3f} ms | GPM off: {statistics.median(off_totals) * 1e3:.3f} ms |",
            f"| sampler cycle, own overhead (NVML time subtracted), GPM on | "
            f"{statistics.median(overheads) * 1e3:.3f} ms | {pct(overheads, 0.99) * 1e3:.3f} ms | "
            f"target ≤ 2 ms; {ratio:.2f}x GPM off ({statistics.median(off_overheads) * 1e3:.3f} ms) |"]


class ScrapeTimeCollector(Collector):
    """The baseline design: NVML is queried inside collect(), on every scrape."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def collect(self):
        yield from NvmlCollector(SnapshotStore(self.sampler.sample())).collect()


def render_rows(gpus: int, repeats: int = 500) -> list[str]:
    clock = Clock()
    sampler = Sampler(fleet(gpus, clock=clock), monotonic=clock)
    sampler.start()
    sampler.sample()  # GPM's first sample: its metrics are in the snapshots from the second on
    clock.now += 1.0
    store = SnapshotStore(sampler.sample())
    cached = CachedExposition(store)
    hits = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        body = cached.render()
        hits.append(time.perf_counter() - t0)
    misses = []
    for _ in range(repeats // 5):
        store.publish(sampler.sample())
        t0 = time.perf_counter()
        cached.render()
        misses.append(time.perf_counter() - t0)
    naive_registry = CollectorRegistry(auto_describe=False)
    naive_registry.register(ScrapeTimeCollector(sampler))
    naive = []
    for _ in range(repeats // 5):
        t0 = time.perf_counter()
        generate_latest(naive_registry)
        naive.append(time.perf_counter() - t0)
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    base = statistics.median(naive)
    return [
        f"| scrape: cached render (the exporter) | {statistics.median(hits) * 1e3:.3f} ms | "
        f"{pct(hits, 0.99) * 1e3:.3f} ms | {base / statistics.median(hits):,.0f}x faster than baseline |",
        f"| render after a new snapshot | {statistics.median(misses) * 1e3:.3f} ms | "
        f"{pct(misses, 0.99) * 1e3:.3f} ms | once per interval, on the sampler thread |",
        f"| baseline: NVML queried in collect() | {base * 1e3:.3f} ms | {pct(naive, 0.99) * 1e3:.3f} ms | "
        f"{series} series, {len(body):,} bytes |",
    ]


RUNNER = """
import sys; sys.path.insert(0, {root!r})
from inferwatch.exporters.server import ExporterSettings, serve
from tests.support.fleet import fleet
serve(ExporterSettings(port={port}, interval_s=1.0, gpm={gpm}), nvml=fleet({gpus}))
"""


def process_rows(gpus: int, seconds: int, gpm: bool) -> list[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    argv = [sys.executable, "-c", RUNNER.format(root=str(ROOT), port=port, gpus=gpus, gpm=gpm)]
    with running("exporter", argv, url) as proc:
        time.sleep(2)  # settle after imports
        stat = lambda: Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()  # noqa: E731
        s0, t0 = stat(), time.monotonic()
        for _ in range(seconds):  # a scrape a second, as an aggressive Prometheus would
            urllib.request.urlopen(url).read()
            time.sleep(1)
        s1, wall = stat(), time.monotonic() - t0
        cpu = (int(s1[11]) + int(s1[12]) - int(s0[11]) - int(s0[12])) / CLK_TCK
        rss = next(int(line.split()[1]) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS")) / 1024
    gpm_on = "on" if gpm else "off"
    return [f"| process RSS after {seconds} s, GPM {gpm_on} | {rss:.1f} MB | — | target ≤ 60 MB |",
            f"| process CPU at 1 s interval, 1 scrape/s, GPM {gpm_on} | {cpu / wall * 100:.2f} % of a core | — | "
            f"target ≤ 1 % |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=30)
    args = parser.parse_args()
    print(f"## NVML exporter, {args.gpus} fake GPUs\n")
    print("| what | median | p99 | note |\n|---|---|---|---|")
    rows = (render_rows(args.gpus) + sampler_rows(args.gpus) + process_rows(args.gpus, args.seconds, gpm=False)
            + process_rows(args.gpus, args.seconds, gpm=True))
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
