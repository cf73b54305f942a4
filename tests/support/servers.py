"""Real servers on loopback for tests: the gateway in a thread, and Prometheus text helpers."""

from __future__ import annotations

import socket
import threading
import time

import requests
import uvicorn
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.serving.gateway import create_app
from inferwatch.serving.server import UVICORN_OPTIONS
from inferwatch.serving.settings import GatewaySettings


def eventually(probe, timeout_s: float = 10.0, interval_s: float = 0.05):
    """Call ``probe`` until it returns something truthy; return that, or the last value after
    ``timeout_s`` (the caller's assertion then shows what was seen)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (all bound at once, so the OS cannot hand one out twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class AppServer:
    """An ASGI app under uvicorn in a thread, on a free loopback port."""

    def __init__(self, app, port: int | None = None, **options) -> None:
        self.app = app
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        options = {"access_log": False, "loop": "uvloop", "http": "httptools", **options}
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", **options)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self):
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("gateway did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)

    def metrics_text(self) -> str:
        return requests.get(f"{self.url}/metrics", timeout=5).text


class GatewayServer(AppServer):
    """The real gateway app, with its own registry."""

    def __init__(self, settings: GatewaySettings | None = None, **app_kwargs) -> None:
        port = free_port()
        base = {"port": port, "host": "127.0.0.1"}
        self.settings = settings.model_copy(update=base) if settings else GatewaySettings(**base)
        self.registry = CollectorRegistry()
        super().__init__(create_app(self.settings, self.registry, **app_kwargs), port, **UVICORN_OPTIONS)

    @property
    def gateway(self):
        return self.app.state.gateway


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus exposition → {(sample name, labels): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of every sample named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lbls), v in samples(text).items() if n == name and want <= lbls)
