"""Host filesystems and memory, read fresh at every scrape.

The stack ships no node_exporter, yet the meta-monitoring alerts must see the disks that
hold Prometheus' TSDB, the drift database and the model caches fill up, and the host run
out of memory. A statvfs per path and one read of /proc/meminfo cost microseconds, so a
scrape reads them itself: unlike NVML readings they need no sampler thread, and a cached
value would only make the disk alerts later.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferwatch.exporters.metrics import HOST_SPECS

log = logging.getLogger(__name__)
MEMINFO = Path("/proc/meminfo")
_SPECS = {spec.name: spec for spec in HOST_SPECS}
_MEMINFO_LINE = re.compile(r"^([^:\s]+):\s+(\d+)(\s+kB)?\s*$")  # "kB" is KiB: fs/proc/meminfo.c shifts by 10


@dataclass(frozen=True)
class FilesystemUsage:
    avail_bytes: int
    size_bytes: int


def filesystem_usage(stat: os.statvfs_result) -> FilesystemUsage:
    """Space left to ordinary writers (f_bavail, so the root-reserved blocks count as used, as
    for df and node_exporter: a service that is not root fails when f_bavail reaches 0), and
    the filesystem's size; both counted in fragments (f_frsize), the unit statvfs uses."""
    return FilesystemUsage(stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize)


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as field -> bytes. Lines in another shape (none today) are skipped, so a
    new kernel field cannot break a scrape."""
    matches = (_MEMINFO_LINE.match(line) for line in text.splitlines())
    return {m[1]: int(m[2]) * (1024 if m[3] else 1) for m in matches if m}


def _family(name: str) -> GaugeMetricFamily:
    spec = _SPECS[name]
    return GaugeMetricFamily(spec.name, spec.doc, labels=spec.label_names)


class HostCollector(Collector):
    """Filesystem usage of each watched path, and host memory. A path that is missing or
    unreadable yields ``inferwatch_host_filesystem_up{path} 0`` and no size or avail series
    (a made-up value would look like a disk, and predict_linear would extrapolate it); the
    path comes back on its own once it can be read. Each distinct failure is logged once.
    A hung network filesystem would hang the scrape, as it hangs ``df``: watch local paths."""

    def __init__(self, paths: Sequence[str], statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
                 meminfo: Path = MEMINFO) -> None:
        self.paths = tuple(paths)
        self.statvfs = statvfs
        self.meminfo = meminfo
        self._logged: dict[str, str] = {}  # what -> the failure last logged for it
        self._lock = threading.Lock()  # scrapes run on concurrent server threads

    def collect(self) -> Iterator[Metric]:
        up, avail, size = (_family(f"inferwatch_host_filesystem_{n}") for n in ("up", "avail_bytes", "size_bytes"))
        for path in self.paths:
            try:
                usage = filesystem_usage(self.statvfs(path))
            except (OSError, ValueError) as exc:  # ValueError: a path statvfs refuses (embedded NUL)
                self._failed(path, f"cannot statvfs {path!r}: {exc}")
                up.add_metric([path], 0.0)
                continue
            self._recovered(path)
            up.add_metric([path], 1.0)
            avail.add_metric([path], float(usage.avail_bytes))
            size.add_metric([path], float(usage.size_bytes))
        if self.paths:
            yield from (up, avail, size)
        yield from self._memory()

    def _memory(self) -> Iterator[Metric]:
        try:
            fields = parse_meminfo(self.meminfo.read_text())
        except OSError as exc:
            self._failed("meminfo", f"cannot read {self.meminfo}: {exc}")
            return
        if "MemAvailable" not in fields or "MemTotal" not in fields:  # kernels before 3.14 lack MemAvailable
            self._failed("meminfo", f"{self.meminfo} has no MemAvailable or MemTotal")
            return
        self._recovered("meminfo")
        for name, field in (("available_bytes", "MemAvailable"), ("total_bytes", "MemTotal")):
            family = _family(f"inferwatch_host_memory_{name}")
            family.add_metric([], float(fields[field]))
            yield family

    def _failed(self, what: str, why: str) -> None:
        with self._lock:
            if self._logged.get(what) == why:
                return
            self._logged[what] = why
        log.warning("%s; its host series are left out until it can be read", why)

    def _recovered(self, what: str) -> None:
        with self._lock:
            if self._logged.pop(what, None) is None:
                return
        log.info("%s can be read again", what)
