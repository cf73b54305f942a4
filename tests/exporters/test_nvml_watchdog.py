"""NVML itself watched per GPU: how long each GPU's queries take, and a call that hangs named
by GPU and query while the exporter keeps answering scrapes."""

from __future__ import annotations

import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from inferwatch.exporters.collector import STALLED_AFTER_S
from inferwatch.exporters.server import Exporter, ExporterSettings, make_server
from tests.support.fleet import fleet
from tests.support.waiting import eventually


def samples(body: str, name: str) -> dict[tuple[str, str], float]:
    """(gpu, query or "") -> value of ``name`` in an exposition."""
    return {(s.labels["gpu"], s.labels.get("query", "")): s.value
            for f in text_string_to_metric_families(body) for s in f.samples if s.name == name}


def test_a_gpu_whose_calls_slow_down_shows_it_in_its_own_duration():
    nvml = fleet(3)
    nvml.delay("nvmlDeviceGetPowerUsage", 1, 0.25)
    exporter = Exporter(ExporterSettings(port=0, interval_s=0.05), nvml)
    exporter.start()
    try:
        durations = samples(exporter.render().decode(), "inferwatch_gpu_nvml_duration_seconds")
        assert set(durations) == {("0", ""), ("1", ""), ("2", "")}
        assert durations[("1", "")] >= 0.25  # the injected delay is a floor of the GPU's time
        assert durations[("0", "")] < 0.1 and durations[("2", "")] < 0.1
    finally:
        exporter.stop()


def test_a_hung_call_is_named_at_every_scrape_while_scrapes_stay_fast_and_clears_when_it_returns():
    nvml = fleet(2)
    # a second between cycles: the snapshot of the cycle that waited stays long enough to be read
    exporter = Exporter(ExporterSettings(port=0, interval_s=1.0), nvml)
    exporter.start()  # its first cycle runs here; the sampler thread's first one, in a second, hangs
    server = make_server(exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"

    def scrape() -> tuple[float, str]:
        started = time.monotonic()
        with urllib.request.urlopen(url, timeout=5) as r:
            return time.monotonic() - started, r.read().decode()

    release = nvml.hang("nvmlDeviceGetTemperature", 1)
    try:
        hung_at = time.monotonic()
        # below the watchdog's second nothing is said: a call that short is a scrape's coincidence
        assert samples(scrape()[1], "inferwatch_gpu_nvml_call_seconds") == {}
        calls = eventually(lambda: samples(scrape()[1], "inferwatch_gpu_nvml_call_seconds"), timeout_s=10)
        assert set(calls) == {("1", "nvmlDeviceGetTemperature")}
        assert STALLED_AFTER_S <= calls[("1", "nvmlDeviceGetTemperature")] <= time.monotonic() - hung_at
        took, body = scrape()
        assert took < 0.5, "a scrape must not wait for the hung call"
        later = samples(body, "inferwatch_gpu_nvml_call_seconds")[("1", "nvmlDeviceGetTemperature")]
        assert later >= calls[("1", "nvmlDeviceGetTemperature")]  # it grows while the call hangs
        release.set()
        eventually(lambda: samples(scrape()[1], "inferwatch_gpu_nvml_call_seconds") == {}, timeout_s=5)
        # the cycle that waited finishes, and says how long GPU 1 took
        durations = eventually(lambda: {k: v for k, v in samples(
            scrape()[1], "inferwatch_gpu_nvml_duration_seconds").items() if v >= STALLED_AFTER_S}, timeout_s=5)
        assert set(durations) == {("1", "")}
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        exporter.stop()
