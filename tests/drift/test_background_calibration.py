"""Calibration happens off the request path: /metrics, /v1/drift, /health and baseline
uploads answer while the worker is held, say ``calibrating`` until it is done, and give the
verdict once it is; the queue is bounded, and a refused or failed calibration is asked for
again."""

from __future__ import annotations

import logging
import threading
import time

import requests

from inferwatch.drift.calibration import next_band, size_band
from inferwatch.drift.calibrator import BackgroundCalibrator
from inferwatch.drift.schema import NUMERIC_FEATURES
from inferwatch.drift.service.app import DriftSettings, create_app
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.store import Store
from inferwatch.drift.verdicts import CalibrationCache, calibrate, reference_of
from inferwatch.drift.window_config import WindowConfig
from tests.support.clock import Clock
from tests.support.feature_records import body, records
from tests.support.servers import AppServer, metric_sum

HOUR = 3600.0


class HeldWorker:
    """A calibration function that records the thread it runs on and waits for ``release``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.threads: set[str] = set()
        self.calls = 0

    def __call__(self, reference, feature, band, resamples):
        self.threads.add(threading.current_thread().name)
        self.calls += 1
        self.entered.set()
        assert self.release.wait(60)
        return calibrate(reference, feature, band, resamples)


def test_requests_never_calibrate_and_verdicts_arrive_when_the_worker_is_done(tmp_path):
    held = HeldWorker()
    store = Store(tmp_path / "drift.sqlite3")
    state = DriftState(store, WindowConfig(), calibrator=BackgroundCalibrator(CalibrationCache(), compute=held))
    now = time.time()
    try:
        with AppServer(create_app(DriftSettings(db_path=str(tmp_path / "unused.sqlite3")), state=state)) as server:
            url = server.url
            ref = records(4000, now - 2 * HOUR, now - 1.5 * HOUR, seed=1)
            assert requests.post(url + "/v1/ingest", data=body(ref), timeout=10).status_code == 200
            shifted = records(3000, now - 600, now, seed=2, prompt_mu=5.8, length_share=0.5)
            assert requests.post(url + "/v1/ingest", data=body(shifted), timeout=10).status_code == 200
            # freezing queues the window's calibrations and answers without waiting for them
            r = requests.post(url + "/v1/baselines", json={"model": "m", "variant": "v1", "from": now - 2 * HOUR,
                                                           "to": now - 1.5 * HOUR}, timeout=10)
            assert r.status_code == 201
            assert held.entered.wait(10)

            (seg,) = requests.get(url + "/v1/drift", timeout=10).json()["segments"]
            assert seg["status"] == "calibrating" and seg["drifted_features"] == []
            prompt = seg["features"]["prompt_tokens"]
            assert prompt["status"] == "calibrating" and prompt["p_value"] is None and not prompt["drifted"]
            psi = prompt["methods"]["psi"]
            assert (psi["status"], psi["threshold"], psi["threshold_source"]) == ("calibrating", None, "calibrated")
            assert psi["score"] > 0 and prompt["methods"]["ks"]["score"] is None  # ks's score is its calibrated p
            text = requests.get(url + "/metrics", timeout=10).text
            assert metric_sum(text, "inferwatch_drift_segment_status", model="m", status="calibrating") == 1
            assert metric_sum(text, "inferwatch_drift_feature_status", feature="prompt_tokens",
                              status="calibrating") == 1
            assert "inferwatch_drift_segment_detected{" not in text  # no verdict is guessed
            assert "inferwatch_drift_feature_detected{" not in text
            assert metric_sum(text, "inferwatch_drift_calibrations_pending") >= 1
            assert requests.get(url + "/health", timeout=10).status_code == 200
            page = requests.get(url + "/report", timeout=10).text
            assert "calibrating" in page and "threshold being calibrated at n=" in page
            assert held.calls == 1  # the worker is still on its first calibration: no request computed one

            held.release.set()
            deadline = time.monotonic() + 60
            while seg["status"] == "calibrating" and time.monotonic() < deadline:
                time.sleep(0.05)
                (seg,) = requests.get(url + "/v1/drift", timeout=10).json()["segments"]
            assert seg["status"] == "drift" and "prompt_tokens" in seg["drifted_features"]
            psi = seg["features"]["prompt_tokens"]["methods"]["psi"]
            assert psi["status"] == "ok" and psi["threshold"] > 0 and psi["calibration_n"] == size_band(3000)
            text = requests.get(url + "/metrics", timeout=10).text
            assert metric_sum(text, "inferwatch_drift_segment_status", model="m", status="drift") == 1
            assert metric_sum(text, "inferwatch_drift_feature_detected", feature="prompt_tokens") == 1
            # one per numeric feature
            assert metric_sum(text, "inferwatch_drift_calibrations_total") >= len(NUMERIC_FEATURES)
        assert held.threads == {"drift-calibration"}
    finally:
        held.release.set()


def _reference():
    clock = 1e9
    state = DriftState(Store(":memory:"), WindowConfig(), clock=lambda: clock)
    state.ingest.add(body(records(1000, clock - 600, clock, seed=3)))
    return reference_of(state.ingest.current(("m", "v1")), "test")


def test_the_queue_is_bounded_and_refused_work_is_asked_for_again():
    held = HeldWorker()
    calibrator = BackgroundCalibrator(CalibrationCache(), queue_size=2, compute=held)
    ref = _reference()
    calibrator.request(ref, "ttft_s", 100, 99)
    assert held.entered.wait(10)  # running, so no longer queued
    for band in (200, 300, 400):
        calibrator.request(ref, "ttft_s", band, 99)
    calibrator.request(ref, "ttft_s", 200, 99)  # already queued: not twice
    assert (calibrator.pending, calibrator.refused) == (3, 1)
    held.release.set()
    assert calibrator.wait(60)
    assert calibrator.calibrated == 3 and calibrator.get(ref, "ttft_s", 400, 99) is None  # refused: still missing
    assert calibrator.wait(60) and calibrator.get(ref, "ttft_s", 400, 99) is not None  # asked again, now there


def test_a_failed_calibration_is_counted_logged_and_asked_for_again(caplog):
    failures = [RuntimeError("out of memory")]

    def flaky(reference, feature, band, resamples):
        if failures:
            raise failures.pop()
        return calibrate(reference, feature, band, resamples)

    calibrator = BackgroundCalibrator(CalibrationCache(), compute=flaky)
    ref = _reference()
    with caplog.at_level(logging.ERROR, logger="inferwatch.drift.calibrator"):
        assert calibrator.get(ref, "e2e_s", 500, 99) is None
        assert calibrator.wait(60)
    assert calibrator.failed == 1 and "out of memory" in caplog.text and "Traceback" in caplog.text
    assert calibrator.get(ref, "e2e_s", 500, 99) is None  # asked again: the worker outlived the failure
    assert calibrator.wait(60) and calibrator.get(ref, "e2e_s", 500, 99) is not None


def test_a_hit_calibrates_the_next_size_band_ahead():
    calibrator = BackgroundCalibrator(CalibrationCache())
    ref = _reference()
    assert calibrator.get(ref, "ttft_s", 1000, 99) is None
    assert calibrator.wait(60) and calibrator.get(ref, "ttft_s", 1000, 99) is not None
    assert calibrator.wait(60)
    above = next_band(size_band(1000))
    assert above > 1000 and calibrator.cache.peek(calibrator.cache.key(ref, "ttft_s", above, 99)) is not None
    full = BackgroundCalibrator(CalibrationCache(entries=1))  # ahead-of-need work must not evict what is used
    assert full.get(ref, "ttft_s", 1000, 99) is None and full.wait(60)
    assert full.get(ref, "ttft_s", 1000, 99) is not None and full.pending == 0 and full.wait(60)
    assert full.calibrated == 1


def test_next_band_is_the_band_above():
    bands = sorted({size_band(n) for n in range(1, 300_000)})
    assert [next_band(b) for b in bands[:-1]] == bands[1:]


def test_a_restart_queues_the_calibrations_its_baselines_need(tmp_path):
    clock = Clock(2e9)
    path = tmp_path / "drift.sqlite3"
    first = DriftState(Store(path), WindowConfig(), clock=clock)
    first.ingest.add(body(records(2000, clock.now - 2 * HOUR, clock.now - 1.5 * HOUR, seed=4)))
    first.ingest.add(body(records(500, clock.now - 600, clock.now, seed=5)))
    first.baselines.freeze(("m", "v1"), clock.now - 2 * HOUR, clock.now - 1.5 * HOUR)
    first.store.close()
    held = HeldWorker()
    again = DriftState(Store(path), WindowConfig(), clock=clock,
                       calibrator=BackgroundCalibrator(CalibrationCache(), compute=held))
    again.restore()
    assert held.entered.wait(10) and again.calibrator.pending == len(NUMERIC_FEATURES)  # before any request asked
    held.release.set()
    assert again.verdicts.calibrated(("m", "v1")).status == "no_drift"
