"""Ingest runs off the event loop, and /health never waits for it: validation and counting
of a 10,000-name batch used to run on the loop and held /health for 3.8 s. Functional, not
timed: an ingest is held inside the state's lock while /health is asked."""

from __future__ import annotations

import threading
import time

import requests

from inferwatch.drift.service.app import DriftSettings, create_app
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.store import Store
from inferwatch.drift.window_config import WindowConfig
from tests.support.clock import Clock
from tests.support.feature_records import body, records
from tests.support.servers import AppServer


def test_health_answers_while_an_ingest_holds_the_state(tmp_path):
    app = create_app(DriftSettings(db_path=str(tmp_path / "drift.sqlite3")))
    state = app.state.drift
    inside, release = threading.Event(), threading.Event()
    count = state.ingest.count

    def held(batch, now):
        with state.ingest._lock:
            inside.set()
            release.wait(30)
            return count(batch, now)

    state.ingest.count = held
    with AppServer(app) as server:
        now = time.time()
        ingest = threading.Thread(target=requests.post, args=(server.url + "/v1/ingest",),
                                  kwargs={"data": body(records(10, now - 60, now - 1, seed=1)), "timeout": 60})
        ingest.start()
        try:
            assert inside.wait(10), "the ingest never reached the state"
            health = requests.get(server.url + "/health", timeout=5)
            assert health.status_code == 200 and health.json()["status"] == "ok"
        finally:
            release.set()
            ingest.join(60)
        assert requests.get(server.url + "/health", timeout=5).json()["ingested"] == 10


def test_idle_segments_expire_on_read_without_further_ingest():
    clock = Clock(1_700_000_000.0)
    state = DriftState(Store(":memory:"), WindowConfig(window_s=600, buckets=10), clock=clock)
    state.ingest.add(body(records(20, clock.now - 60, clock.now - 1, seed=2)))
    assert state.ingest.segments() == [("m", "v1")]
    clock.now += 700  # a whole window without records, and no ingest since
    assert state.ingest.segments() == []
    assert state.ingest.expired == 1
