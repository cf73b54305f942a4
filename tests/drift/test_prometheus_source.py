"""Fleet-wide drift from histogram buckets, against a real Prometheus scraping a real
prometheus_client exporter over loopback."""

from __future__ import annotations

import math
import shutil
import time

import numpy as np
import pytest
import requests
from prometheus_client import CollectorRegistry, Histogram, start_http_server

from inferwatch.drift.prometheus_source import PrometheusSource, SourceError, buckets_to_histogram
from inferwatch.drift.service.app import DriftSettings, create_app
from tests.support.prometheus_server import running_prometheus
from tests.support.servers import AppServer
from tests.support.sockets import free_port

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
METRIC = "fleet_prompt_tokens"


def test_cumulative_buckets_become_bin_counts():
    h = buckets_to_histogram({1.0: 2, 2.0: 5, 4.0: 5, math.inf: 9})
    assert list(h.counts) == [2, 3, 0, 4]
    assert list(h.edges.values[:4]) == [0.0, 1.0, 2.0, 4.0]
    with pytest.raises(SourceError):
        buckets_to_histogram({1.0: 2, math.inf: 3})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A real exporter of a histogram, and a real Prometheus scraping it every second."""
    assert shutil.which("prometheus"), "prometheus is installed by `make test` (Debian package)"
    tmp = tmp_path_factory.mktemp("prom")
    registry = CollectorRegistry()
    hist = Histogram(METRIC, "prompt tokens", buckets=BUCKETS, registry=registry)
    exporter_port = free_port()
    server, _thread = start_http_server(exporter_port, addr="127.0.0.1", registry=registry)
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{"job_name": "fleet",
                                  "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}]}
    try:
        with running_prometheus(config, tmp) as url:
            yield hist, url
    finally:
        server.shutdown()


def observe_for(hist, mu: float, seconds: float, rng) -> int:
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for v in rng.lognormal(mu, 0.6, 100):
            hist.observe(v)
        n += 100
        time.sleep(0.1)
    return n


def test_fleet_drift_from_buckets(fleet, tmp_path):
    hist, prom_url = fleet
    rng = np.random.default_rng(0)
    time.sleep(2)  # Prometheus has scraped the empty histogram: increases start from a sample
    observe_for(hist, 4.0, 5, rng)
    t_a = time.time()
    observe_for(hist, 5.5, 5, rng)
    t_b = time.time()
    observe_for(hist, 5.5, 5, rng)
    time.sleep(2.5)  # let the last observations be scraped
    t_c = time.time() - 1.5

    source = PrometheusSource(prom_url)
    shifted = source.drift(METRIC, 'job="fleet"', reference_end=t_a, current_end=t_b, window_s=5)
    assert sum(shifted["reference"]["counts"]) > 1000 and sum(shifted["current"]["counts"]) > 1000
    for method in ("psi", "js", "kl", "wasserstein", "ks"):
        assert shifted["methods"][method]["drifted"], (method, shifted["methods"][method])
    ref = np.array(shifted["reference"]["counts"])
    assert ref.argmax() == 6  # lognormal(4, 0.6): most prompts in (32, 64]

    same = source.drift(METRIC, 'job="fleet"', reference_end=t_b, current_end=t_c, window_s=5)
    for method in ("psi", "js", "kl", "wasserstein"):
        assert not same["methods"][method]["drifted"], (method, same["methods"][method])

    # the same through the drift service's HTTP endpoint
    settings = DriftSettings(db_path=str(tmp_path / "d.sqlite3"), prometheus_url=prom_url)
    with AppServer(create_app(settings)) as service:
        r = requests.get(service.url + "/v1/fleet-drift", params={
            "metric": METRIC, "selector": 'job="fleet"', "reference_end": t_a, "current_end": t_b, "window": 5},
            timeout=30)
        assert r.status_code == 200 and r.json()["methods"]["psi"]["drifted"]
        for params, code in (({"metric": "bad metric!", "reference_end": t_a}, 400),
                             ({"metric": METRIC, "selector": "job=fleet", "reference_end": t_a}, 400),
                             ({"metric": METRIC}, 400),
                             ({"metric": METRIC, "reference_end": t_b, "current_end": t_a}, 400),
                             ({"metric": "no_such_histogram", "reference_end": t_a, "current_end": t_b}, 422)):
            r = requests.get(service.url + "/v1/fleet-drift", params=params, timeout=30)
            assert r.status_code == code, (params, r.text)
            assert r.json()["error"]["message"]


def test_prometheus_down_is_a_clear_503():
    with pytest.raises(SourceError) as info:
        PrometheusSource(f"http://127.0.0.1:{free_port()}").drift(METRIC, "", 1.0, 2.0, 60)
    assert info.value.status == 503 and "not reachable" in str(info.value)
