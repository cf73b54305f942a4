"""Real servers on loopback for tests: the gateway in a thread, and Prometheus text helpers."""

from __future__ import annotations

import asyncio
import threading
import time

import requests
import uvicorn
import uvloop
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.serving.gateway import create_app
from inferwatch.serving.server import uvicorn_options
from inferwatch.serving.settings import GatewaySettings
from tests.support.sockets import free_port

LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


class AppServer:
    """An ASGI app under uvicorn in a thread, on a free loopback port."""

    def __init__(self, app, port: int | None = None, **options) -> None:
        self.app = app
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        options = {"access_log": False, "loop": "uvloop", "http": "httptools", **options}
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", **options)
        self._server = uvicorn.Server(config)
        self._new_loop = LOOPS[config.loop]
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        """uvicorn's ``Server.run`` without hiding the loop: it is ours, so ``stall`` can reach it."""
        with asyncio.Runner(loop_factory=self._new_loop) as runner:
            self.loop = runner.get_loop()
            runner.run(self._server.serve())

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

    def stall(self, seconds: float) -> threading.Event:
        """Keep the server's event loop busy for ``seconds``, as a saturated CPU would: what
        arrives meanwhile (a client's bytes or hang-up, upstream's answer) is seen at once after.
        Setting the event returned ends the stall early (once what it waits for happened)."""
        release = threading.Event()
        self.loop.call_soon_threadsafe(release.wait, seconds)
        return release

    def metrics_text(self) -> str:
        return requests.get(f"{self.url}/metrics", timeout=5).text


class GatewayServer(AppServer):
    """The real gateway app, with its own registry."""

    def __init__(self, settings: GatewaySettings | None = None, **app_kwargs) -> None:
        port = free_port()
        base = {"port": port, "host": "127.0.0.1"}
        self.settings = settings.model_copy(update=base) if settings else GatewaySettings(**base)
        self.registry = CollectorRegistry()
        app = create_app(self.settings, self.registry, **app_kwargs)
        super().__init__(app, port, **uvicorn_options(app.state.gateway.proxy, self.settings.limit_concurrency))

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
