"""Bulk histogram updates against prometheus_client's own ``observe``."""

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import generate_latest

from inferwatch.common.latency_buckets import INTER_TOKEN_BUCKETS
from inferwatch.serving.metrics import observe_many


def _pair():
    registry_a, registry_b = CollectorRegistry(), CollectorRegistry()
    a = Histogram("gap_seconds", "x", ["route"], buckets=INTER_TOKEN_BUCKETS, registry=registry_a).labels("r")
    b = Histogram("gap_seconds", "x", ["route"], buckets=INTER_TOKEN_BUCKETS, registry=registry_b).labels("r")
    return (registry_a, a), (registry_b, b)


@pytest.mark.parametrize("values", [
    [],
    list(INTER_TOKEN_BUCKETS),  # every value exactly on a bound: le is inclusive
    [0.0, -1.0, 1e-9, 3.0, 1e9, math.inf],  # below the first bound, past the last finite one
    [random.Random(seed).lognormvariate(-4, 1.5) for seed in range(500)],
])
def test_observe_many_equals_observing_one_by_one(values):
    (ra, a), (rb, b) = _pair()
    observe_many(a, values)
    for v in values:
        b.observe(v)
    samples_a = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in ra.collect() for s in m.samples}
    samples_b = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in rb.collect() for s in m.samples}
    assert samples_a.keys() == samples_b.keys()
    for key, value in samples_b.items():
        if key[0].endswith("_sum"):
            assert samples_a[key] == pytest.approx(value, rel=1e-12)
        elif not key[0].endswith("_created"):
            assert samples_a[key] == value, key
    if all(math.isfinite(v) for v in values) and len(values) < 50:  # sums of few exact values print alike
        strip = [line for line in generate_latest(ra).splitlines() if b"_created" not in line]
        assert strip == [line for line in generate_latest(rb).splitlines() if b"_created" not in line]


def test_observe_many_leaves_nan_out_of_the_buckets_as_observe_does():
    (ra, a), (rb, b) = _pair()
    observe_many(a, [0.01, math.nan])
    b.observe(0.01)
    b.observe(math.nan)
    assert ra.get_sample_value("gap_seconds_count", {"route": "r"}) == \
        rb.get_sample_value("gap_seconds_count", {"route": "r"}) == 1
    assert math.isnan(ra.get_sample_value("gap_seconds_sum", {"route": "r"}))
