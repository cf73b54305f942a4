"""A real Prometheus for a test: started on a free loopback port from a config dict, its data
in the test's temporary folder, stopped on leaving."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import requests
import yaml

from inferwatch.common.supervise import ManagedProcess
from tests.support.sockets import free_port


@contextlib.contextmanager
def running_prometheus(config: dict, tmp: Path, *flags: str, port: int | None = None) -> Iterator[str]:
    """Yields Prometheus's URL once it is ready; ``flags`` are extra command-line flags, ``port``
    one chosen before (for a config that scrapes Prometheus itself)."""
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = port or free_port()
    prom = ManagedProcess("prometheus", ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                         f"--storage.tsdb.path={tmp / 'data'}",
                                         f"--web.listen-address=127.0.0.1:{port}", *flags],
                          log_path=tmp / "prometheus.log", health_url=f"http://127.0.0.1:{port}/-/ready")
    prom.start()
    try:
        prom.wait_healthy(60, poll_s=0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        prom.stop()


def instant_query(url: str, expr: str) -> list[dict]:
    """The result vector of an instant query; a query Prometheus refuses fails the test."""
    answer = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]
