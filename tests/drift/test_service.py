"""The drift service over HTTP: ingest, windows, baselines, results, metrics, report, faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import requests

from inferwatch.drift.schema import NUMERIC_FEATURES
from inferwatch.drift.service.app import DriftSettings, create_app
from inferwatch.drift.service.state import DriftState
from inferwatch.drift.store import Store
from inferwatch.drift.window_config import WindowConfig
from tests.support.clock import Clock
from tests.support.feature_records import body, records
from tests.support.servers import AppServer, metric_sum
from tests.support.sockets import free_port

HOUR = 3600.0


@pytest.fixture
def service(tmp_path):
    settings = DriftSettings(db_path=str(tmp_path / "drift.sqlite3"), token="s3cret", max_body_bytes=4_000_000)
    with AppServer(create_app(settings)) as server:
        server.auth = {"authorization": "Bearer s3cret"}
        yield server


def post(server, path, data, auth=True):
    return requests.post(server.url + path, data=data, headers=server.auth if auth else {}, timeout=30)


def drift_of(server, **params):
    return requests.get(server.url + "/v1/drift", params=params, timeout=10).json()["segments"]


def settled_drift_of(url, **params):
    """/v1/drift once no segment is calibrating: thresholds are computed in the background,
    and every read until then says so."""
    deadline = time.monotonic() + 120
    while True:
        segments = requests.get(url + "/v1/drift", params=params, timeout=10).json()["segments"]
        if all(s["status"] != "calibrating" for s in segments) or time.monotonic() > deadline:
            return segments
        time.sleep(0.05)


def freeze_reference(server, now, **shape):
    ref = records(4000, now - 2 * HOUR, now - 1.5 * HOUR, seed=1, **shape)
    assert post(server, "/v1/ingest", body(ref)).status_code == 200
    r = requests.post(server.url + "/v1/baselines", json={"model": "m", "variant": "v1", "from": now - 2 * HOUR,
                                                          "to": now - 1.5 * HOUR}, headers=server.auth, timeout=30)
    assert r.status_code == 201 and r.json()["records"] == 4000
    return ref


def test_ingest_then_drift_detected_and_exposed(service):
    now = time.time()
    freeze_reference(service, now)
    shifted = records(3000, now - 600, now, seed=2, prompt_mu=5.8, ttft_scale=0.2, length_share=0.5)
    r = post(service, "/v1/ingest", body(shifted))
    assert r.status_code == 200 and r.json() == {"accepted": 3000, "in_window": 3000}

    (seg,) = settled_drift_of(service.url, model="m", variant="v1")
    assert seg["window_records"] == 3000 and seg["baseline_records"] == 4000
    assert seg["status"] == "drift" and set(seg["drifted_features"]) >= {"prompt_tokens", "ttft_s", "finish_reason"}
    assert "completion_tokens" not in seg["drifted_features"]  # untouched feature stays quiet
    prompt = seg["features"]["prompt_tokens"]["methods"]
    assert all(prompt[m]["drifted"] for m in ("kl", "js", "psi", "wasserstein", "ks"))
    assert prompt["ks"]["direction"] == "lower_is_drift" and prompt["psi"]["direction"] == "higher_is_drift"
    assert prompt["psi"]["threshold_source"] == "calibrated" and prompt["psi"]["calibration_n"] <= 3000
    assert prompt["ks"]["threshold_source"] == "alpha" and prompt["ks"]["threshold"] == 0.01
    assert seg["features"]["finish_reason"]["methods"]["chi2"]["drifted"]
    assert seg["features"]["ttft_s"]["methods"]["wasserstein"]["drifted"]
    assert not seg["features"]["completion_tokens"]["methods"]["psi"]["drifted"]

    text = service.metrics_text()
    assert metric_sum(text, "inferwatch_drift_detected", model="m", variant="v1", feature="prompt_tokens",
                      method="psi") == 1
    assert metric_sum(text, "inferwatch_drift_score", feature="prompt_tokens", method="psi") == pytest.approx(
        prompt["psi"]["score"])
    assert metric_sum(text, "inferwatch_drift_threshold", feature="prompt_tokens", method="ks", source="alpha") == 0.01
    assert metric_sum(text, "inferwatch_drift_threshold", feature="prompt_tokens", method="psi",
                      source="calibrated") == pytest.approx(prompt["psi"]["threshold"])
    assert metric_sum(text, "inferwatch_drift_feature_detected", feature="prompt_tokens") == 1
    assert metric_sum(text, "inferwatch_drift_feature_detected", feature="completion_tokens") == 0
    assert metric_sum(text, "inferwatch_drift_segment_detected", model="m", variant="v1") == 1
    assert metric_sum(text, "inferwatch_drift_window_records", model="m") == 3000
    assert metric_sum(text, "inferwatch_drift_ingested_records_total") == 7000

    exact = requests.get(service.url + "/v1/drift/exact", params={"model": "m", "variant": "v1",
                                                                  "feature": "prompt_tokens"}, timeout=10).json()
    # the reservoir is sized per window: 3000 records in 11 of 60 buckets still give 2000 values
    assert exact["status"] == "ok" and exact["ks_p_value"] < 1e-6 and exact["current_sample"] == 2000

    report = requests.get(service.url + "/report", timeout=10).text
    assert report.count("<svg") >= 8 and "prompt_tokens" in report and "DRIFT" in report
    assert "Summary" in report and "calibrated at n=" in report and "reference n=4,000" in report
    # each feature's unit once, after its description (not "prompt length, tokens (tokens)")
    assert "prompt length (tokens)." in report and "time to first token, streamed requests (s)." in report
    assert "tokens (tokens)" not in report and "seconds" not in report


def test_ab_comparison_between_variants(service):
    now = time.time()
    post(service, "/v1/ingest", body(records(2000, now - 300, now, seed=20, variant="stable")))
    post(service, "/v1/ingest", body(records(2000, now - 300, now, seed=21, variant="canary", prompt_mu=5.0,
                                             ttft_scale=0.25)))
    post(service, "/v1/ingest", body(records(2000, now - 300, now, seed=22, variant="stable-2")))
    r = requests.get(service.url + "/v1/compare", params={"model": "m", "a": "stable", "b": "canary"}, timeout=10)
    assert r.status_code == 200 and r.json()["records"] == {"a": 2000, "b": 2000}
    features = r.json()["features"]
    assert r.json()["status"] == "drift" and "ttft_s" in r.json()["drifted_features"]
    assert features["ttft_s"]["methods"]["wasserstein"]["drifted"]
    assert not features["prompt_tokens"]["methods"]["psi"]["drifted"]
    same = requests.get(service.url + "/v1/compare", params={"model": "m", "a": "stable", "b": "stable-2"},
                        timeout=10).json()
    assert same["status"] == "no_drift" and same["drifted_features"] == []
    for params, code in (({"model": "m", "a": "stable"}, 400), ({"model": "m", "a": "x", "b": "y"}, 404),
                         ({"model": "m", "a": "stable", "b": "stable"}, 400)):
        assert requests.get(service.url + "/v1/compare", params=params, timeout=10).status_code == code


def test_same_distribution_is_not_detected(service):
    now = time.time()
    freeze_reference(service, now)
    post(service, "/v1/ingest", body(records(3000, now - 600, now, seed=3)))
    (seg,) = settled_drift_of(service.url)
    assert seg["status"] == "no_drift" and seg["drifted_features"] == []
    for feature, f in seg["features"].items():
        assert f["status"] == "ok" and not f["drifted"], feature


def test_false_positive_rate_over_repeated_windows(tmp_path):
    """Twenty fresh windows from the reference's distribution, through the service's own path:
    the segment verdict (Holm at alpha 0.01) fires at most twice (P = 0.1 % for independent
    evaluations). All windows share one reference, whose own sampling error persists, so a
    single method may fire a little more often than over fresh pairs (tests in
    test_calibration.py draw fresh references); 5 of 20 would be far off."""
    clock = Clock(1_000_000.0)
    state = DriftState(Store(tmp_path / "fp.sqlite3"), WindowConfig(window_s=600, buckets=10), clock=clock)
    state.ingest.add(body(records(5000, clock.now - 3000, clock.now - 2000, seed=100)))
    state.baselines.freeze(("m", "v1"), clock.now - 3000, clock.now - 2000)
    alarms: dict[tuple[str, str], int] = {}
    for trial in range(20):
        clock.now += 1200  # the previous window has slid out entirely
        state.ingest.add(body(records(2000, clock.now - 500, clock.now, seed=200 + trial)))
        assert state.ingest.records(("m", "v1")) == 2000
        verdict = state.verdicts.calibrated(("m", "v1"))
        alarms[("segment", "holm")] = alarms.get(("segment", "holm"), 0) + (verdict.status == "drift")
        for feature, methods in state.verdicts.results(("m", "v1")).items():
            for name, r in methods.items():
                assert r.status == "ok"
                alarms[(feature, name)] = alarms.get((feature, name), 0) + r.drifted
    assert alarms[("segment", "holm")] <= 2
    for (feature, name), count in alarms.items():
        assert count <= 4, (feature, name, count)


@pytest.mark.parametrize("mutate, field, index", [
    (lambda r: r[3].pop("model"), "model", 3),
    (lambda r: r[7].update(prompt_tokens="12"), "prompt_tokens", 7),
    (lambda r: r[0].update(prompt_tokens=-1), "prompt_tokens", 0),
    (lambda r: r[5].update(status=42), "status", 5),
    (lambda r: r[2].update(finished_at=time.time() + 86400), "finished_at", 2),
    (lambda r: r[9].update(prompt="leaked text"), "prompt", 9),
    (lambda r: r[1].update(stream=1), "stream", 1),
])
def test_bad_batch_is_rejected_whole_naming_record_and_field(service, mutate, field, index):
    now = time.time()
    batch = records(10, now - 60, now, seed=4)
    mutate(batch)
    r = post(service, "/v1/ingest", body(batch))
    assert r.status_code == 422
    err = r.json()["error"]
    assert (err["record"], err["field"]) == (index, field) and f"record {index}" in err["message"]
    assert drift_of(service) == []  # nothing of the batch was counted
    assert metric_sum(service.metrics_text(), "inferwatch_drift_rejected_batches_total", reason="invalid") == 1


@pytest.mark.parametrize("data, fragment", [
    (b"{not json", "not valid JSON"), (b'{"records": []}', "no records"), (b"[1]", '{"records"'),
    (b'{"records": [{"model": NaN}]}', "not valid JSON"),
])
def test_malformed_bodies(service, data, fragment):
    r = post(service, "/v1/ingest", data)
    assert r.status_code == 422 and fragment in r.json()["error"]["message"]


def test_auth_and_size_limits(service):
    now = time.time()
    assert post(service, "/v1/ingest", body(records(5, now - 5, now, seed=5)), auth=False).status_code == 401
    assert requests.post(service.url + "/v1/ingest", data=b"{}", timeout=5,
                         headers={"authorization": "Bearer wrong"}).status_code == 401
    big = post(service, "/v1/ingest", b"x" * 4_100_000)
    assert big.status_code == 413
    assert requests.get(service.url + "/v1/drift", timeout=5).status_code == 200  # reads stay open


def test_baseline_errors(service):
    now = time.time()
    bad = [({"model": "m", "variant": "v1", "from": now, "to": now - 1}, "from"),
           ({"model": "m", "variant": "v1", "from": now - 10, "to": now}, "from"),  # no records in range
           ({"variant": "v1", "from": 0, "to": 1}, "model"),
           ({"model": "m", "variant": "v1", "histograms": {"prompt_tokens": [1, 2]}}, "histograms.prompt_tokens"),
           ({"model": "m", "variant": "v1", "histograms": {"colour": [1]}}, "histograms.colour"),
           ({"model": "m", "variant": "v1", "from": 0, "to": 1, "histograms": {"prompt_tokens": None}}, "histograms"),
           ({"model": "m", "variant": "v1", "from": 0}, "to")]
    for doc, field in bad:
        r = requests.post(service.url + "/v1/baselines", json=doc, headers=service.auth, timeout=10)
        assert r.status_code == 422, doc
        assert r.json()["error"]["field"] == field


@pytest.mark.parametrize("doc, field", [({"hellinger": 0.1}, "hellinger"), ({"ks": 1.5}, "ks"),
                                        ({"psi": -1}, "psi"), ({"psi": "high"}, "psi"), ({"psi": True}, "psi"),
                                        ({"alpha": None}, "alpha"), ({"alpha": "0.05"}, "alpha"),
                                        ({"alpha": 1e-4}, "alpha")])  # below 1/(1,999 + 1): thresholds infinite
def test_threshold_changes_are_validated(service, doc, field):
    r = requests.put(service.url + "/v1/thresholds", json=doc, headers=service.auth, timeout=10)
    assert r.status_code == 422 and r.json()["error"]["field"] == field
    got = requests.get(service.url + "/v1/thresholds", timeout=10).json()  # nothing applied
    assert got["methods"]["psi"] == {"mode": "calibrated"} and got["alpha"] == 0.01


def test_the_published_request_schemas_say_what_is_taken(service):
    """Where the OpenAPI and the service disagreed: alpha may be left out but not be null;
    a histogram's keys are the features, each with its number of bins; an integer written
    2.0 is the integer JSON Schema says it is."""
    from inferwatch.drift.api import bins
    from inferwatch.drift.schema import FEATURES

    schemas = requests.get(service.url + "/openapi.json", timeout=10).json()["components"]["schemas"]
    alpha = schemas["ThresholdsRequest"]["properties"]["alpha"]
    assert alpha["type"] == "number" and alpha["minimum"] == 1 / 2000 and "anyOf" not in alpha
    assert schemas["ThresholdsRequest"]["additionalProperties"] is False
    histograms = schemas["Histograms"]
    assert list(histograms["properties"]) == list(FEATURES) and histograms["additionalProperties"] is False
    for name, prop in histograms["properties"].items():
        (counts,) = (option for option in prop["anyOf"] if option.get("type") == "array")
        assert counts["minItems"] == counts["maxItems"] == bins(name) and counts["items"]["minimum"] == 0
    assert schemas["FeedbackRecord"]["properties"]["at"]["type"] == "number"

    r = requests.post(service.url + "/v1/baselines", headers=service.auth, timeout=10, json={
        "model": "m", "variant": "v1", "histograms": {"status_class": [5.0, 0, 0, 0]}})
    assert r.status_code == 201 and r.json()["records"] == 5, r.text
    now = time.time()
    batch = records(3, now - 60, now, seed=7)
    batch[0]["e2e_s"] = 2  # a float field takes an integer
    assert post(service, "/v1/ingest", body(batch)).json() == {"accepted": 3, "in_window": 3}
    for i, name, value in ((0, "status", 200.0), (1, "prompt_tokens", 12.0), (2, "completion_tokens", 12.5)):
        wrong = [dict(r) for r in batch]
        wrong[i][name] = value  # an int field takes no float, integral or not: the column turned float
        r = post(service, "/v1/ingest", body(wrong))
        error = r.json()["error"]
        assert r.status_code == 422 and (error["record"], error["field"]) == (i, name), r.text
        assert "without a fraction" in error["message"]


def test_uploaded_baseline(service):
    from inferwatch.drift.schema import FEATURES

    now = time.time()
    counts = [0] * FEATURES["prompt_tokens"].edges.bins
    counts[3] = 1000  # every reference prompt had 9..16 tokens
    r = requests.post(service.url + "/v1/baselines", json={"model": "m", "variant": "v1",
                                                           "histograms": {"prompt_tokens": counts}},
                      headers=service.auth, timeout=10)
    assert r.status_code == 201
    post(service, "/v1/ingest", body(records(500, now - 60, now, seed=6)))
    (seg,) = settled_drift_of(service.url)
    assert seg["features"]["prompt_tokens"]["methods"]["js"]["drifted"]
    assert seg["features"]["ttft_s"]["status"] == "insufficient_data"  # the upload had no ttft
    assert seg["features"]["ttft_s"]["methods"]["js"]["status"] == "insufficient_data"
    report = requests.get(service.url + "/report", timeout=10)  # a baseline in one bin has one bar
    assert report.status_code == 200 and "all values" in report.text


def test_window_memory_does_not_grow_with_traffic(tmp_path):
    """Counts are fixed per live bucket and each bucket keeps at most R raw values per
    feature, so 100,000 records cost no more than the stated bound; the sample read back is
    the window's R values."""
    from inferwatch.drift.windows import WIDTH

    clock = Clock(2_000_000.0)
    state = DriftState(Store(":memory:"), WindowConfig(window_s=600, buckets=10, reservoir=500),
                       clock=clock)
    state.ingest.add(body(records(1000, clock.now - 500, clock.now, seed=7)))
    sizes = []
    for i in range(20):
        state.ingest.add(body(records(5000, clock.now - 500, clock.now, seed=8 + i)))
        sizes.append(state.ingest.windows[("m", "v1")].nbytes())
    # buckets x (counts + R keys, values per numeric feature)
    bound = 10 * (WIDTH * 8 + len(NUMERIC_FEATURES) * 500 * 16)
    assert max(sizes) <= bound
    assert state.ingest.records(("m", "v1")) == 101_000
    assert state.ingest.windows[("m", "v1")].samples("ttft_s", clock.now).size == 500


def test_kill_9_and_restart_keep_every_acknowledged_batch(tmp_path):
    port, db = free_port(), tmp_path / "drift.sqlite3"
    argv = [sys.executable, "-m", "inferwatch", "drift", "serve", "--port", str(port), "--db-path", str(db)]
    url = f"http://127.0.0.1:{port}"

    def start():
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(url + "/health", timeout=1)
                return proc
            except requests.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)

    proc = start()
    now = time.time()
    acknowledged = 0
    try:
        ref = records(2000, now - 2 * HOUR, now - 1.5 * HOUR, seed=9)
        assert requests.post(url + "/v1/ingest", data=body(ref), timeout=10).status_code == 200
        assert requests.post(url + "/v1/baselines", json={"model": "m", "variant": "v1", "from": now - 2 * HOUR,
                                                          "to": now - HOUR}, timeout=10).status_code == 201
        for i in range(20):
            r = requests.post(url + "/v1/ingest", data=body(records(250, now - 600, now, seed=10 + i)), timeout=10)
            assert r.status_code == 200
            acknowledged += 250
        assert requests.put(url + "/v1/thresholds", json={"psi": 0.2}, timeout=10).status_code == 200
        before = settled_drift_of(url)[0]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc = start()
        after = settled_drift_of(url)[0]
        assert after["window_records"] == acknowledged == before["window_records"]
        assert after["baseline_records"] == 2000
        psi_after = after["features"]["prompt_tokens"]["methods"]["psi"]
        assert psi_after["threshold"] == 0.2 and psi_after["threshold_source"] == "fixed"  # settings survive too
        assert psi_after["score"] == pytest.approx(before["features"]["prompt_tokens"]["methods"]["psi"]["score"])
        assert after["features"] == before["features"]  # same bins, same calibration draws
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_report_cli_writes_the_html(service, tmp_path):
    now = time.time()
    freeze_reference(service, now)
    post(service, "/v1/ingest", body(records(500, now - 60, now, seed=11)))
    out = tmp_path / "r.html"
    result = subprocess.run([sys.executable, "-m", "inferwatch", "drift", "report", "--url", service.url,
                             "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "<svg" in out.read_text() and "mean_logprob" in out.read_text()
    failed = subprocess.run([sys.executable, "-m", "inferwatch", "drift", "report", "--url",
                             f"http://127.0.0.1:{free_port()}", "--out", str(out)], capture_output=True, text=True,
                            timeout=60)
    assert failed.returncode == 2 and "Could not fetch" in failed.stderr


def test_window_slides(tmp_path):
    clock = Clock(3_000_000.0)
    state = DriftState(Store(":memory:"), WindowConfig(window_s=600, buckets=6), clock=clock)
    # buckets are 100 s; the window holds the 6 newest, so between 500 and 600 s of history
    state.ingest.add(body(records(100, clock.now - 450, clock.now - 400, seed=12)))
    state.ingest.add(body(records(50, clock.now - 50, clock.now, seed=13)))
    assert state.ingest.records(("m", "v1")) == 150
    clock.now += 200  # the first 100 slid out of the 600 s window
    assert state.ingest.records(("m", "v1")) == 50
    assert int(np.sum(state.ingest.current(("m", "v1"))["prompt_tokens"].counts)) == 50


def test_settings_refuse_an_alpha_the_resamples_cannot_resolve():
    with pytest.raises(ValueError, match="resamples"):
        DriftSettings(alpha=0.001, resamples=99)  # 1/(99 + 1) = 0.01: every calibrated threshold infinite
