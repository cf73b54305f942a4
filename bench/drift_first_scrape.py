"""The first scrape after many baselines arrive: how long /metrics, /v1/drift and /health
take, and how long until every segment has its verdict.

    python bench/drift_first_scrape.py [--baselines 200 1000]

Per segment: a baseline frozen from 200 records and a current window of 60, through the
service over HTTP (a real uvicorn server on loopback, default settings). Right after the
last baseline is frozen: one /metrics scrape (Prometheus gives up after 10 s by default)
while /health is polled every 50 ms, then one /v1/drift, then /v1/drift until no segment
is calibrating, then one more scrape. Speaks HTTP only, so it measures any version of the
service the same way.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
import requests  # noqa: E402

from inferwatch.drift.service.app import DriftSettings, create_app  # noqa: E402
from tests.support.feature_records import records  # noqa: E402
from tests.support.servers import AppServer  # noqa: E402

HOUR = 3600.0
SCRAPE_TIMEOUT_S = 10.0
GROUP = 5  # segments per ingest batch


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


class HealthProbe:
    """Polls /health in a thread and keeps the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url, self.worst, self._stop = url, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                took, _ = timed(lambda: session.get(self.url + "/health", timeout=600))
                self.worst = max(self.worst, took)
                self._stop.wait(0.05)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run(n: int) -> str:
    settings = DriftSettings(db_path=":memory:", max_segments=n + 10)
    now = time.time()
    with AppServer(create_app(settings)) as server, requests.Session() as http:
        url = server.url
        # each group of segments has its baseline records in its own 10 s, so freezing one
        # reads one stored batch (freezing parses every batch that overlaps its range)
        groups = range(0, n, GROUP)
        for g, start in enumerate(groups):
            segs = range(start, min(start + GROUP, n))
            t0 = now - 2 * HOUR + 10 * g
            ref = [r for i in segs for r in records(200, t0, t0 + 9, seed=10 + i, model=f"model-{i}")]
            cur = [r for i in segs for r in records(60, now - 60, now, seed=100_000 + i, model=f"model-{i}")]
            for batch in (ref, cur):
                http.post(url + "/v1/ingest", data=orjson.dumps({"records": batch}), timeout=600).raise_for_status()
        t_frozen = time.perf_counter()
        for i in range(n):
            t0 = now - 2 * HOUR + 10 * (i // GROUP)
            http.post(url + "/v1/baselines", json={"model": f"model-{i}", "variant": "v1", "from": t0, "to": t0 + 9},
                      timeout=600).raise_for_status()
        t_freeze = time.perf_counter() - t_frozen
        ready_from = time.perf_counter()
        with HealthProbe(url) as probe:
            t_metrics, _ = timed(lambda: http.get(url + "/metrics", timeout=600).raise_for_status())
        t_drift, first = timed(lambda: http.get(url + "/v1/drift", timeout=600).json()["segments"])
        calibrating = sum(s["status"] == "calibrating" for s in first)
        segments = first
        while any(s["status"] == "calibrating" for s in segments):
            time.sleep(0.5)
            segments = http.get(url + "/v1/drift", timeout=600).json()["segments"]
        t_ready = time.perf_counter() - ready_from
        t_next, _ = timed(lambda: http.get(url + "/metrics", timeout=600).raise_for_status())
        verdicts = sum(s["status"] in ("drift", "no_drift") for s in segments)
    ok = "yes" if t_metrics < SCRAPE_TIMEOUT_S else "**no**"
    return (f"| {n:,} | {t_freeze:.1f} s | {t_metrics:.2f} s | {ok} | {probe.worst * 1e3:.0f} ms | {t_drift:.2f} s "
            f"({calibrating:,} calibrating) | {t_ready:.1f} s ({verdicts:,} verdicts) | {t_next:.2f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baselines", type=int, nargs="+", default=[200, 1000])
    args = parser.parse_args()
    print("| baselines | freezing them | first /metrics | within 10 s | slowest /health meanwhile | first /v1/drift "
          "| every verdict in, after | /metrics then |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.baselines:
        print(run(n), flush=True)


if __name__ == "__main__":
    main()
