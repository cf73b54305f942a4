"""The Prometheus side: a Collector over the latest snapshot, and a render cache.

A scrape never calls NVML. It reads the snapshot the sampler thread published last, and
because that snapshot only changes once per interval, its rendering is cached: most
scrapes cost a dictionary lookup and a socket write.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferwatch.exporters.metrics import SPECS
from inferwatch.exporters.pod_resources import PodResources
from inferwatch.exporters.sampler import InFlight, Snapshot
from inferwatch.exporters.xid import XidWatcher


class SnapshotStore:
    """The hand-over point between the sampler thread and scrapes. ``failures`` counts
    cycles that produced no snapshot (an unexpected error): kept here, not in a snapshot,
    because such a cycle has none to put it in."""

    def __init__(self, first: Snapshot) -> None:
        self._latest = first
        self._lock = threading.Lock()
        self.failures = 0

    def record_failure(self) -> None:
        with self._lock:
            self.failures += 1

    @property
    def latest(self) -> Snapshot:
        with self._lock:
            return self._latest

    def publish(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._latest = snapshot


class NvmlCollector(Collector):
    def __init__(self, store: SnapshotStore, xid: XidWatcher | None = None, pods: PodResources | None = None) -> None:
        self.store = store
        self.xid = xid
        self.pods = pods

    def collect(self) -> Iterator[Metric]:
        samples = dict(self.store.latest.samples)
        samples["inferwatch_nvml_sampler_errors"] = [((), float(self.store.failures))]
        if self.xid is not None:
            samples.update(self.xid.samples())
        if self.pods is not None:
            gpus = [labels for labels, _ in samples.get("inferwatch_gpu_info", [])]
            migs = {labels[-1]: labels[:4] for labels, _ in samples.get("inferwatch_gpu_mig_memory_total_bytes", [])}
            samples.update(self.pods.samples(gpus, migs))
        for spec in SPECS:
            rows = samples.get(spec.name)
            if rows is None:
                continue
            cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = cls(spec.name, spec.doc, labels=spec.label_names)
            for labels, value in rows:
                family.add_metric(labels, value)
            yield family


STALLED_AFTER_S = 1.0  # a call this long is no scrape's coincidence: NVML calls take microseconds
_CALL = next(spec for spec in SPECS if spec.name == "inferwatch_gpu_nvml_call_seconds")


def _stalled(call: InFlight | None) -> bytes:
    """The NVML call the sampler has waited on for over ``STALLED_AFTER_S``, by GPU and query:
    the watchdog that names a hung GPU while the snapshot it would be in ages."""
    if call is None or (elapsed := time.monotonic() - call.since) < STALLED_AFTER_S:
        return b""
    family = GaugeMetricFamily(_CALL.name, _CALL.doc, labels=_CALL.label_names)
    family.add_metric((*call.labels, call.query), elapsed)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once(family))
    return generate_latest(registry)


class _Once(Collector):
    def __init__(self, family: Metric) -> None:
        self.family = family

    def collect(self) -> Iterator[Metric]:
        yield self.family


class CachedExposition:
    """Text exposition, re-rendered only when the snapshot or the XID counts change.

    Snapshot age is the one value that changes between renders; it is appended fresh to
    every response, so the cache never serves a wrong age.
    """

    def __init__(self, store: SnapshotStore, xid: XidWatcher | None = None,
                 clock: Callable[[], float] = time.time, in_flight: Callable[[], InFlight | None] = lambda: None,
                 pods: PodResources | None = None) -> None:
        self.store = store
        self.xid = xid
        self.clock = clock
        self.in_flight = in_flight
        self.pods = pods
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = NvmlCollector(store, xid, pods)
        self.registry.register(self.collector)
        self._key: tuple[int, ...] | None = None
        self._body = b""
        self._lock = threading.Lock()

    def attach_xid(self, xid: XidWatcher | None) -> None:
        """XID counting started late (NVML came up after the exporter), or stopped (NVML lost)."""
        self.xid = self.collector.xid = xid

    def warm(self) -> tuple[Snapshot, bytes]:
        """Render now if the data changed; the sampler thread calls this after each publish
        so that scrapes find the cache warm."""
        snapshot = self.store.latest
        xid = self.xid
        key = (snapshot.seq, self.store.failures, id(xid), xid.version if xid else 0,
               self.pods.version if self.pods else 0)
        with self._lock:
            if key != self._key:
                self._body, self._key = generate_latest(self.registry), key
            return snapshot, self._body

    def render(self) -> bytes:
        snapshot, body = self.warm()
        age = max(0.0, self.clock() - snapshot.taken_at)
        return body + _stalled(self.in_flight()) + (
            b"# HELP inferwatch_nvml_snapshot_age_seconds Seconds since the served snapshot was taken.\n"
            b"# TYPE inferwatch_nvml_snapshot_age_seconds gauge\n"
            b"inferwatch_nvml_snapshot_age_seconds %r\n" % age)
