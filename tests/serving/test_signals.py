"""The per-request signals are declared once (serving/signals.py): each observed one is the
gateway's histogram of its name and buckets, each recorded one a field of the feature record,
and a real request through the gateway puts the same value in both."""

from __future__ import annotations

import dataclasses

import pytest
import requests
from prometheus_client import CollectorRegistry

from inferwatch.drift.feature_record import FeatureRecord
from inferwatch.serving.features import MemorySink
from inferwatch.serving.metrics import NAMESPACE, TOKEN_LABELS, create_metrics
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.signals import OBSERVED, RECORDED, SIGNALS
from tests.support.servers import GatewayServer
from tests.support.waiting import eventually

CHAT = "/v1/chat/completions"


def test_each_signal_is_declared_once_and_makes_its_metric_and_its_record_field():
    assert len({s.name for s in SIGNALS}) == len(SIGNALS)
    registry = CollectorRegistry()
    metrics = create_metrics(registry)
    families = {f.name: f for f in registry.collect()}
    for signal in OBSERVED:
        family = families[f"{NAMESPACE}_{signal.metric}"]
        assert family.type == "histogram" and family.documentation == signal.doc
        histogram = metrics.signals[signal.name]
        assert histogram._labelnames == TOKEN_LABELS and tuple(histogram._upper_bounds[:-1]) == signal.buckets
    fields = {f.name for f in dataclasses.fields(FeatureRecord)}
    assert {field for field, _ in RECORDED} <= fields and len(RECORDED) == len({f for f, _ in RECORDED})


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_a_request_puts_the_same_value_in_the_metric_and_the_record(stub, stream):
    sink = MemorySink()
    with GatewayServer(GatewaySettings(upstream_url=stub.url, feature_flush_s=0.05), feature_sink=sink) as gw:
        body = {"model": "ok", "messages": [{"role": "user", "content": "hi"}], "stream": stream, "max_tokens": 8}
        with requests.post(gw.url + CHAT, json=body, timeout=15, stream=stream) as r:
            assert r.status_code == 200
            _ = r.content
        (record,) = eventually(lambda: list(sink.records), timeout_s=10)
        for signal in OBSERVED:
            labels = {"model": "ok", "variant": gw.settings.variant, "route": CHAT}
            count = gw.registry.get_sample_value(f"{NAMESPACE}_{signal.metric}_count", labels) or 0
            total = gw.registry.get_sample_value(f"{NAMESPACE}_{signal.metric}_sum", labels) or 0
            if signal.field is None:
                continue
            value = getattr(record, signal.field)
            if value is None:
                assert count == 0, signal.name  # not said by this answer: observed nowhere
            else:
                assert (count, total) == (1, pytest.approx(value)), signal.name
        assert record.prompt_tokens == 3 and record.completion_tokens >= 1  # the stub's usage
        assert (record.ttft_s is not None) == stream  # only a stream has a first token
