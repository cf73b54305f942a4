"""The exporter process: NVML loader, sampler thread, HTTP endpoint, settings."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

from prometheus_client import CollectorRegistry, generate_latest
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from inferwatch.exporters.collector import CachedExposition, SnapshotStore
from inferwatch.exporters.host import HostCollector
from inferwatch.exporters.pod_resources import DEFAULT_SOCKET, PodResources
from inferwatch.exporters.sampler import Sampler
from inferwatch.exporters.xid import XidWatcher

log = logging.getLogger(__name__)
STALE_AFTER_S = 60.0  # /health fails past this snapshot age (GPUExporterSnapshotStale's threshold)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ExporterSettings(BaseSettings):
    """INFERWATCH_EXPORTER_* or flags."""

    model_config = SettingsConfigDict(env_prefix="INFERWATCH_EXPORTER_", frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(9400, ge=0, le=65535)
    interval_s: float = Field(1.0, gt=0, le=300, description="sampling interval")
    slow_interval_s: float = Field(10.0, gt=0, le=3600, description="interval of slow queries (process list)")
    processes: bool = Field(False, description="export GPU memory per process (pid label: opt-in)")
    gpm: bool = Field(True, description="GPM profiling metrics (SM, tensor, DRAM activity) where the GPU has them")
    xid_events: bool = True
    retry_s: float = Field(30.0, gt=0, description="how often to retry NVML while it is unavailable")
    pod_resources_socket: Path = Field(DEFAULT_SOCKET, description="the kubelet's pod-resources socket: which pod "
                                       "uses which GPU (mounted read-only by the DaemonSet); absent, no pod series")
    pod_resources_interval_s: float = Field(10.0, gt=0, le=3600, description="how often to ask the kubelet")
    pod_resources_timeout_s: float = Field(2.0, gt=0, le=60, description="how long one answer may take")
    watch_paths: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="comma-separated absolute paths whose filesystem's free and total bytes are exported "
                        "(Prometheus' TSDB, the drift database, model caches); '~' is expanded")

    @field_validator("watch_paths", mode="before")
    @classmethod
    def _split_paths(cls, value: object) -> object:
        """One environment variable holds the list: INFERWATCH_EXPORTER_WATCH_PATHS=/a,/b."""
        return tuple(p.strip() for p in value.split(",") if p.strip()) if isinstance(value, str) else value

    @field_validator("watch_paths")
    @classmethod
    def _absolute_paths(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        """Absolute, since the path is the series' label and a relative one would depend on the
        exporter's working directory; each once, since a repeated label set breaks the scrape."""
        expanded = [os.path.expanduser(p) for p in paths]
        relative = [p for p in expanded if not os.path.isabs(p)]
        if relative:
            raise ValueError(f"watch paths must be absolute: {', '.join(relative)}")
        return tuple(dict.fromkeys(expanded))


def load_nvml() -> Any:
    """The real nvidia-ml-py module, or a stand-in that fails like a host without a driver."""
    try:
        import pynvml
    except ImportError:
        class Missing(Exception):
            pass

        def init() -> None:
            raise Missing("nvidia-ml-py is not installed (pip install nvidia-ml-py)")

        return SimpleNamespace(NVMLError=Missing, nvmlInit=init)
    return pynvml


class Exporter:
    """Sampler thread + XID thread + cached exposition; start() never raises on NVML trouble,
    and the sampler thread outlives any error of a cycle."""

    def __init__(self, settings: ExporterSettings, nvml: Any) -> None:
        self.settings = settings
        self.sampler = Sampler(nvml, processes=settings.processes, slow_interval_s=settings.slow_interval_s,
                               gpm=settings.gpm)
        self.xid: XidWatcher | None = None
        self.store: SnapshotStore | None = None
        self.exposition: CachedExposition | None = None
        self.host_registry = CollectorRegistry(auto_describe=False)  # not cached: read at every scrape
        self.host_registry.register(HostCollector(settings.watch_paths))
        self.pods = PodResources(settings.pod_resources_socket, settings.pod_resources_interval_s,
                                 settings.pod_resources_timeout_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error = ""  # the last unexpected error of a cycle: logged once, counted always
        self._retry_at = 0.0  # when to try NVML again while it is unavailable

    def start(self) -> None:
        if self.sampler.start():
            self._start_xid()
        self.store = SnapshotStore(self.sampler.sample())
        self.exposition = CachedExposition(self.store, self.xid, in_flight=lambda: self.sampler.in_flight,
                                           pods=self.pods)
        self.pods.start()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _running(self) -> tuple[SnapshotStore, CachedExposition]:
        if self.store is None or self.exposition is None:
            raise RuntimeError("the exporter is not started: call start() first")
        return self.store, self.exposition

    def _start_xid(self) -> None:
        """A watcher for the session just started; the stopped watcher of a lost session (if
        any) hands its counts over."""
        if not self.settings.xid_events:
            return
        devices = self.sampler.devices
        self.xid = XidWatcher(self.sampler.nvml, {d.index: d.handle for d in devices},
                              {d.index: d.labels for d in devices}, previous=self.xid)
        self.xid.start()
        if self.exposition is not None:
            self.exposition.attach_xid(self.xid)

    def _loop(self) -> None:
        """Sample every interval; while NVML is unavailable (driver not loaded yet, lost
        mid-run), retry it every ``retry_s`` so the exporter recovers without a restart.
        An unexpected error in a cycle is logged (once per kind), counted in
        ``inferwatch_nvml_sampler_errors_total``, and the next cycle runs as usual."""
        interval = self.settings.interval_s
        next_at = time.monotonic() + interval
        self._retry_at = time.monotonic() + self.settings.retry_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            try:
                self._cycle()
            except Exception as exc:
                self._running()[0].record_failure()  # a scrape re-renders: the count is part of its cache key
                kind = f"{type(exc).__name__}: {exc}"
                log.log(logging.DEBUG if kind == self._last_error else logging.ERROR,
                        "NVML sampling cycle failed; counted in inferwatch_nvml_sampler_errors_total, next cycle "
                        "runs as usual", exc_info=True)
                self._last_error = kind
            next_at += interval
            if next_at < time.monotonic():  # a slow cycle: skip ahead instead of bursting
                next_at = time.monotonic() + interval

    def _cycle(self) -> None:
        if not self.sampler.up and time.monotonic() >= self._retry_at:
            self._retry_at = time.monotonic() + self.settings.retry_s
            if self.sampler.start(quiet=True):
                log.info("NVML is available now: %d GPU(s)", len(self.sampler.devices))
                self._start_xid()
        store, exposition = self._running()
        was_up = self.sampler.up
        store.publish(self.sampler.sample())
        if was_up and not self.sampler.up:  # NVML lost in this cycle: retry it in retry_s
            self._retry_at = time.monotonic() + self.settings.retry_s
            if self.xid is not None:
                self.xid.stop()  # its event set went with the session; its counts stay served
        elif self.xid is not None:  # a GPU lost at start and discovered since
            for dev in self.sampler.devices:
                self.xid.add(dev.index, dev.handle, dev.labels)
        exposition.warm()

    def render(self) -> bytes:
        """The exposition: the cached NVML part, then the host part read now."""
        return self._running()[1].render() + generate_latest(self.host_registry)

    def health(self) -> tuple[bool, str]:
        """False (and why) when the sampler thread is dead or its snapshot stale: a
        supervisor or a liveness probe should restart the exporter then."""
        if self._thread is None or not self._thread.is_alive():
            return False, "sampler thread dead"
        age = time.time() - self._running()[0].latest.taken_at
        stale_after = max(STALE_AFTER_S, 3 * self.settings.interval_s)
        if age > stale_after:
            return False, f"snapshot stale: {age:.0f}s old (over {stale_after:.0f}s)"
        return True, "ok"

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.interval_s + 5)
        if self.xid is not None:
            self.xid.stop()
        self.pods.stop()
        self.sampler.stop()


class ListenError(Exception):
    """The endpoint cannot be opened (address not local or not resolvable, port in use): a
    configuration error, reported as one and not as a traceback."""


def make_server(exporter: Exporter) -> ThreadingHTTPServer:
    """The HTTP endpoint, bound and listening; serves once ``serve_forever`` runs. Raises
    ListenError."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/metrics":
                self._send(200, exporter.render(), CONTENT_TYPE)
            elif self.path == "/health":
                ok, why = exporter.health()
                self._send(200 if ok else 503, json.dumps({"status": why}).encode(), "application/json")
            else:
                self._send(404, b"not found: try /metrics\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    host, port = exporter.settings.host, exporter.settings.port
    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except (OSError, OverflowError) as exc:  # gaierror (no such address) is an OSError too
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ListenError(f"Cannot listen on {host}:{port}: {why}") from None
    server.daemon_threads = True
    return server


def serve(settings: ExporterSettings, nvml: Any | None = None) -> None:
    """Bind first, then open NVML: an exporter that cannot listen never touches the GPUs.
    Raises ListenError."""
    exporter = Exporter(settings, nvml if nvml is not None else load_nvml())
    server = make_server(exporter)
    try:
        exporter.start()
        log.info("NVML exporter on http://%s:%d/metrics", settings.host, server.server_address[1])
        server.serve_forever()
    finally:
        server.server_close()
        exporter.stop()
