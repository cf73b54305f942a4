"""The exporter process: NVML loader, sampler thread, HTTP endpoint, settings."""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from exporters.collector import CachedExposition, SnapshotStore
from exporters.sampler import Sampler
from exporters.xid import XidWatcher

log = logging.getLogger(__name__)
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
    """Sampler thread + XID thread + cached exposition; start() never raises on NVML trouble."""

    def __init__(self, settings: ExporterSettings, nvml: Any) -> None:
        self.settings = settings
        self.sampler = Sampler(nvml, processes=settings.processes, slow_interval_s=settings.slow_interval_s,
                               gpm=settings.gpm)
        self.xid: XidWatcher | None = None
        self.store: SnapshotStore | None = None
        self.exposition: CachedExposition | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.sampler.start():
            self._start_xid()
        self.store = SnapshotStore(self.sampler.sample())
        self.exposition = CachedExposition(self.store, self.xid)
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _start_xid(self) -> None:
        if not self.settings.xid_events:
            return
        devices = self.sampler.devices
        self.xid = XidWatcher(self.sampler.nvml, {d.index: d.handle for d in devices},
                              {d.index: d.labels for d in devices})
        self.xid.start()
        if self.exposition is not None:
            self.exposition.attach_xid(self.xid)

    def _loop(self) -> None:
        """Sample every interval; while NVML is unavailable (driver not loaded yet, GPU reset),
        retry it every ``retry_s`` so the exporter recovers without a restart."""
        interval = self.settings.interval_s
        next_at = time.monotonic() + interval
        retry_at = time.monotonic() + self.settings.retry_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            if not self.sampler.up and time.monotonic() >= retry_at:
                retry_at = time.monotonic() + self.settings.retry_s
                if self.sampler.start(quiet=True):
                    log.info("NVML is available now: %d GPU(s)", len(self.sampler.devices))
                    self._start_xid()
            self.store.publish(self.sampler.sample())
            if self.xid is not None:  # a GPU lost at start and discovered since
                for dev in self.sampler.devices:
                    self.xid.add(dev.index, dev.handle, dev.labels)
            self.exposition.warm()
            next_at += interval
            if next_at < time.monotonic():  # a slow cycle: skip ahead instead of bursting
                next_at = time.monotonic() + interval

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.interval_s + 5)
        if self.xid is not None:
            self.xid.stop()
        self.sampler.stop()


def make_server(exporter: Exporter) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path.split("?")[0] == "/metrics":
                self._send(200, exporter.exposition.render(), CONTENT_TYPE)
            elif self.path == "/health":
                self._send(200, b'{"status":"ok"}', "application/json")
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

    server = ThreadingHTTPServer((exporter.settings.host, exporter.settings.port), Handler)
    server.daemon_threads = True
    return server


def serve(settings: ExporterSettings, nvml: Any | None = None) -> None:
    exporter = Exporter(settings, nvml if nvml is not None else load_nvml())
    exporter.start()
    server = make_server(exporter)
    log.info("NVML exporter on http://%s:%d/metrics", settings.host, server.server_address[1])
    try:
        server.serve_forever()
    finally:
        server.server_close()
        exporter.stop()
