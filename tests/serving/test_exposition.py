"""inferwatch.serving.exposition.render against prometheus_client's own encoders, read back by
prometheus_client's own parsers (the independent truth), and byte for byte."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    disable_created_metrics,
    enable_created_metrics,
    metrics as prometheus_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.samples import Exemplar, Timestamp

from inferwatch.serving.exposition import render
from tests.support.gateway_metrics import populated_registry

ROOT = Path(__file__).resolve().parents[2]

PROMETHEUS_SCRAPE = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
                     "application/openmetrics-text;version=0.0.1;q=0.5,"
                     "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")

# Accept header -> the content type choose_encoder answers (written out, not computed).
NEGOTIATION = {
    "": "text/plain; version=0.0.4; charset=utf-8",
    "text/html, */*": "text/plain; version=0.0.4; charset=utf-8",
    "text/plain;version=0.0.4": "text/plain; version=0.0.4; charset=utf-8",
    "application/openmetrics-text": "application/openmetrics-text; version=1.0.0; charset=utf-8",
    "application/openmetrics-text; version=1.0.0":
        "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores",
    "application/openmetrics-text; version=0.0.1":  # too old: not taken, and nothing else offered
        "text/plain; version=0.0.4; charset=utf-8",
    "application/openmetrics-text;version=0.0.1,text/plain;version=1.0.0;escaping=dots":
        "text/plain; version=1.0.0; charset=utf-8; escaping=dots",
    "application/openmetrics-text; version=1.0.0; escaping=values":
        "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=values",
    "application/openmetrics-text; version=2.0.0; escaping=bogus":
        "application/openmetrics-text; version=2.0.0; charset=utf-8; escaping=underscores",
    "text/plain; version=1.0.0; escaping=allow-utf-8": "text/plain; version=1.0.0; charset=utf-8; escaping=allow-utf-8",
    PROMETHEUS_SCRAPE: "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=allow-utf-8",
}

# Both formats under every name escaping, except OpenMetrics with dots or values: there
# prometheus_client's own parser rejects prometheus_client's own output (the TYPE line and
# the samples escape the name differently: "inferwatch__gateway__requests" against
# "inferwatch__gateway__requests__total" or "U__..."); see test_unparseable_openmetrics.
FORMATS = ("", "application/openmetrics-text", PROMETHEUS_SCRAPE, "text/plain; version=1.0.0; escaping=allow-utf-8",
           "text/plain; version=1.0.0; escaping=dots", "text/plain; version=1.0.0; escaping=values")
OPENMETRICS_DOTS = "application/openmetrics-text; version=1.0.0; escaping=dots"
OPENMETRICS_VALUES = "application/openmetrics-text; version=1.0.0; escaping=values"

AWKWARD = ('say "hi"', "back\\slash", "new\nline", "ünïcødé ✓ 日本", "", "all \\\"\n\\n of them")
# prometheus_client's OpenMetrics parser cannot read an exemplar label value with an odd
# number of quotes, so exemplars carry theirs in pairs.
EXEMPLAR_VALUES = ('say "hi"', "back\\slash", "new\nline", "ünï ✓ \\n")
FLOATS = (math.nan, math.inf, -math.inf, 1e300, 5e-324, -1e-300, 1234567.0, 12345678.5, 0.1, -0.0, 2.0 ** 70)


class CustomCollector:
    """Families of every type, built by hand, with timestamps and exemplars."""

    def collect(self):
        counter = CounterMetricFamily("custom_jobs", "Jobs.", labels=["queue"])
        counter.add_metric(["a\"b"], 7, created=1_700_000_000.5, timestamp=Timestamp(1_700_000_000, 123_000_000),
                           exemplar=Exemplar({"trace_id": "t\n1"}, 1.0, 1_700_000_000.25))
        gauge = GaugeMetricFamily("custom_temperature", "Temp with \\ and \n.", labels=["room"])
        gauge.add_metric(["ünï"], -3.5, timestamp=1_700_000_001)
        histogram = HistogramMetricFamily("custom_latency", "Latency.", labels=["op"], unit="seconds")
        histogram.add_metric(["read"], [("0.1", 1, Exemplar({"id": "x"}, 0.05)), ("+Inf", 3)], sum_value=0.9)
        gauge_histogram = GaugeHistogramMetricFamily("custom_queue", "Queue.", buckets=[("1", 2), ("+Inf", 5)],
                                                     gsum_value=8)
        yield from (counter, gauge, histogram, gauge_histogram,
                    SummaryMetricFamily("custom_size", "Size.", count_value=4, sum_value=10),
                    InfoMetricFamily("custom_build", "Build.", value={"version": "1\"2"}),
                    StateSetMetricFamily("custom_state", "State.", value={"up": True, "down": False}),
                    UnknownMetricFamily("custom_mystery", "Mystery.", value=math.nan))


def every_kind() -> CollectorRegistry:
    registry = CollectorRegistry(target_info={"env": "te\"st"})
    doc = 'Doc with \\ and \n and "quotes" and ✓.'
    counter = Counter("things", doc, ["path", "note"], registry=registry)
    for i, value in enumerate(AWKWARD):
        counter.labels(value, f"n{i}").inc(i, exemplar={"trace_id": EXEMPLAR_VALUES[i // 2]} if i % 2 else None)
    Counter("plain_total", "Label-less, with an exemplar.", registry=registry).inc(2.5, {"a": "b\\c"})
    Counter("transferred", "A unit.", unit="bytes", registry=registry).inc(2 ** 40)
    Counter("ns:colons", "A colon in the name.", ["x"], registry=registry).labels("y").inc()
    Counter("app.dotted", "A UTF-8 name and label name.", ["a.b"], registry=registry).labels("c").inc()
    Counter("never_labelled", "No children yet.", ["x"], registry=registry)

    values = Gauge("values", doc, ["case"], registry=registry)
    for value in FLOATS:
        values.labels(repr(value)).set(value)
    Gauge("unset", "Label-less, never set.", registry=registry)
    Gauge("empty_gauge", "No children yet.", ["x"], registry=registry)
    Gauge("from_function", "set_function.", registry=registry).set_function(lambda: 42.5)
    Gauge("recent", "mostrecent mode.", ["x"], multiprocess_mode="mostrecent", registry=registry).labels("y").set(1)

    histogram = Histogram("latency_seconds", doc, ["route"], registry=registry)
    # No NaN or negative amounts: OpenMetrics forbids such a _sum (the parser says so), though
    # prometheus_client writes one.
    for i, value in enumerate((0.001, 0.3, 7.0, 100.0, math.inf, 1e-300, 1e300, 5e-324)):
        exemplar = {"trace_id": EXEMPLAR_VALUES[i % len(EXEMPLAR_VALUES)]} if i % 3 else None
        histogram.labels(AWKWARD[i % len(AWKWARD)]).observe(value, exemplar)
    Histogram("plain_histogram", "Label-less.", buckets=(1, 2), registry=registry).observe(1.5)
    Histogram("empty_histogram", "No children yet.", ["x"], registry=registry)

    Summary("summary_seconds", doc, ["x"], registry=registry).labels("y").observe(3)
    Enum("state", "An enum.", ["x"], states=["a", "b"], registry=registry).labels("y").state("b")
    Info("build", doc, registry=registry).info({"version": '1.0 "beta"\n', "commit": "ünï"})
    Info("labelled", "Info with labels.", ["x"], registry=registry).labels("y").info({"k": "v"})
    Info("empty_info", "Never set.", registry=registry)

    class SubclassedCounter(Counter):
        pass

    SubclassedCounter("subclassed", "A subclass.", registry=registry).inc()
    registry.register(CustomCollector())
    return registry


def negative_buckets() -> CollectorRegistry:
    """A histogram with a negative bucket has no _sum: OpenMetrics wants one beside a _count."""
    registry = CollectorRegistry()
    Histogram("negative_buckets", "No _sum.", ["x"], buckets=(-5, 0, 5), registry=registry).labels("y").observe(-1)
    Histogram("plain_negative", "No _sum.", buckets=(-1, 1), registry=registry).observe(0)
    return registry


REGISTRIES: dict[str, Callable[[], CollectorRegistry]] = {
    "every kind": every_kind,
    "gateway 1x1": lambda: populated_registry(1, 1),
    "gateway 4x2": lambda: populated_registry(4, 2),
    "empty": CollectorRegistry,
}


def number(value: float) -> float | str:
    return "NaN" if math.isnan(value) else value


def parsed(body: bytes, content_type: str) -> list[tuple]:
    """Families as prometheus_client's parser for the content type reads them, NaN made comparable."""
    parse = parse_openmetrics if content_type.startswith("application/openmetrics-text") else parse_text
    return [(family.name, family.type, family.documentation, family.unit,
             [(s.name, s.labels, number(s.value), s.timestamp,
               s.exemplar and (s.exemplar.labels, number(s.exemplar.value), s.exemplar.timestamp))
              for s in family.samples])
            for family in parse(body.decode("utf-8"))]


def reference(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


def assert_same(registry: CollectorRegistry, accept: str) -> list[tuple]:
    """Our output reads back as prometheus_client's does, and is its very bytes."""
    expected, expected_type = reference(registry, accept)
    body, content_type = render(registry, accept)
    assert content_type == expected_type
    families = parsed(body, content_type)
    assert families == parsed(expected, expected_type)
    assert body == expected
    return families


@pytest.mark.parametrize("accept", FORMATS)
@pytest.mark.parametrize("name", REGISTRIES)
def test_matches_prometheus_client(name: str, accept: str) -> None:
    registry = REGISTRIES[name]()
    assert_same(registry, accept)
    assert_same(registry, accept)  # again, from the cached prefixes


@pytest.mark.parametrize(("name", "accept"), [("every kind", OPENMETRICS_DOTS), ("every kind", OPENMETRICS_VALUES),
                                              ("gateway 4x2", OPENMETRICS_DOTS), ("gateway 4x2", OPENMETRICS_VALUES),
                                              ("negative buckets", "application/openmetrics-text")])
def test_unparseable_openmetrics(name: str, accept: str) -> None:
    """OpenMetrics that prometheus_client's parser rejects even as prometheus_client writes it: its bytes, exactly."""
    registry = {**REGISTRIES, "negative buckets": negative_buckets}[name]()
    with pytest.raises(ValueError):
        parsed(*reference(registry, accept))
    assert render(registry, accept) == reference(registry, accept)


@pytest.mark.parametrize("accept", [a for a in FORMATS if not a.startswith("application/openmetrics-text")])
def test_negative_buckets_in_the_text_format(accept: str) -> None:
    names = [s[0] for family in assert_same(negative_buckets(), accept) for s in family[4]]
    assert sum(n.endswith("_count") for n in names) == 2 and not any(n.endswith("_sum") for n in names)


def test_awkward_values_survive_the_round_trip() -> None:
    """The parsers give back the original strings and floats, not merely what both encoders agree on."""
    body, content_type = render(every_kind(), "application/openmetrics-text")
    samples: dict[str, list[tuple]] = defaultdict(list)
    for family in parsed(body, content_type):
        for s in family[4]:
            samples[s[0]].append(s)
    assert {s[1]["path"] for s in samples["things_total"]} == set(AWKWARD)
    assert {s[4][0]["trace_id"] for s in samples["things_total"] if s[4]} == set(EXEMPLAR_VALUES[:3])
    assert sorted(map(str, (s[2] for s in samples["values"]))) == sorted(map(str, map(number, FLOATS)))
    assert [s[2] for s in samples["latency_seconds_count"]] == [2, 2, 1, 1, 1, 1]
    assert samples["build_info"][0][1] == {"version": '1.0 "beta"\n', "commit": "ünï"}
    assert samples["from_function"][0][2] == 42.5
    assert "empty_histogram_count" not in samples and "empty_gauge" not in samples


@pytest.mark.parametrize("accept", NEGOTIATION)
def test_content_type_negotiation(accept: str) -> None:
    registry = every_kind()
    assert reference(registry, accept)[1] == NEGOTIATION[accept]
    body, content_type = render(registry, accept)
    assert content_type == NEGOTIATION[accept]
    assert body.endswith(b"# EOF\n") == content_type.startswith("application/openmetrics-text")
    assert body == reference(registry, accept)[0]


@pytest.mark.parametrize("accept", ["application/openmetrics-text; version=abc", "text/plain;version", ";;,"])
def test_malformed_accept_fails_as_choose_encoder_does(accept: str) -> None:
    registry = every_kind()
    try:
        expected = reference(registry, accept)
    except Exception as exc:  # version=abc: choose_encoder compares 'abc' with an int
        with pytest.raises(type(exc)):
            render(registry, accept)
    else:
        assert render(registry, accept) == expected


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text"])
def test_changes_after_a_render_are_rendered(accept: str) -> None:
    """The prefix cache holds label sets only: new values, new children, removed children,
    cleared and unregistered metrics all show on the next scrape."""
    registry = CollectorRegistry()
    requests = Counter("requests", "Requests.", ["model"], registry=registry)
    latency = Histogram("latency", "Latency.", ["model"], buckets=(1, 2), registry=registry)
    gauge = Gauge("depth", "Depth.", ["model"], registry=registry)
    for model in ("a", "b"):
        requests.labels(model).inc()
        latency.labels(model).observe(1.5)
        gauge.labels(model).set(1)
    assert_same(registry, accept)

    requests.labels("a").inc(41, {"trace_id": "new"})
    latency.labels("b").observe(0.5)
    gauge.labels("c").set(7)
    body, content_type = render(registry, accept)
    samples = {(s[0], s[1].get("model"), s[1].get("le")): s for f in parsed(body, content_type) for s in f[4]}
    assert samples["requests_total", "a", None][2] == 42
    assert samples["latency_bucket", "b", "1.0"][2] == 1 and samples["latency_count", "b", None][2] == 2
    assert samples["depth", "c", None][2] == 7
    assert_same(registry, accept)

    requests.remove("a")
    latency.clear()
    families = {f[0]: f[4] for f in assert_same(registry, accept)}
    assert {s[1]["model"] for s in families["requests"]} == {"b"}
    assert families["latency"] == []

    latency.labels("b").observe(5)  # a new child for an old label set: its own values, not the removed one's
    registry.unregister(gauge)
    families = {f[0]: f[4] for f in assert_same(registry, accept)}
    assert "depth" not in families
    assert [s[2] for s in families["latency"] if s[0] == "latency_count"] == [1]


def test_created_series_follow_prometheus_clients_switch() -> None:
    registries = every_kind(), populated_registry(1, 1)
    disable_created_metrics()
    try:
        for accept in ("", "application/openmetrics-text"):
            assert b"_created" not in render(registries[1], accept)[0]
            for registry in registries:
                assert_same(registry, accept)
    finally:
        enable_created_metrics()
    assert prometheus_metrics._use_created
    assert b"_created" in render(registries[1], "")[0]


def test_created_series_follow_the_environment() -> None:
    """PROMETHEUS_DISABLE_CREATED_SERIES is read when prometheus_client is imported: a process of its own."""
    script = ("import sys; from prometheus_client.exposition import choose_encoder; "
              "from tests.support.gateway_metrics import populated_registry; from inferwatch.serving.exposition import render\n"
              "r = populated_registry(1, 1)\n"
              "for accept in ('', 'application/openmetrics-text'):\n"
              "    body = render(r, accept)[0]\n"
              "    assert body == choose_encoder(accept)[0](r) and b'_created' not in body, accept\n")
    env = {**os.environ, "PROMETHEUS_DISABLE_CREATED_SERIES": "True"}
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True, timeout=60)


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed")
def test_promtool_accepts_the_text_format() -> None:
    """promtool (2.42 here) lints the Prometheus text format only; OpenMetrics is left to the parser tests."""
    body = render(populated_registry(4, 2), "")[0]
    result = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_histograms_stay_whole_while_observed() -> None:
    """Rendered from a worker thread while another thread observes and adds children: every
    histogram's buckets stay cumulative and its count equals its +Inf bucket."""
    registry = CollectorRegistry()
    latency = Histogram("latency", "Latency.", ["model"], buckets=(0.1, 0.5, 1), registry=registry)
    requests = Counter("requests", "Requests.", ["model"], registry=registry)
    stop = threading.Event()

    def observe() -> None:
        i = 0
        while not stop.is_set():
            model = f"m{i % 50}"
            latency.labels(model).observe((i % 13) / 10, {"i": str(i)})
            requests.labels(model).inc()
            i += 1

    writer = threading.Thread(target=observe)
    writer.start()
    try:
        for _ in range(30):
            body, content_type = render(registry, "application/openmetrics-text")
            buckets: dict[str, list[float]] = {}
            counts: dict[str, float] = {}
            for family in parsed(body, content_type):
                for name, labels, value, _, _ in family[4]:
                    if name == "latency_bucket":
                        buckets.setdefault(labels["model"], []).append(value)
                    elif name == "latency_count":
                        counts[labels["model"]] = value
            assert buckets.keys() == counts.keys()
            for model, cumulative in buckets.items():
                assert cumulative == sorted(cumulative) and cumulative[-1] == counts[model]
    finally:
        stop.set()
        writer.join()
