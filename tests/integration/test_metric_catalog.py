"""The metric names the rules (and dashboards) read exist where they claim to: vLLM's part
against a real vLLM server's /metrics, the latency SLOs' bucket boundaries against a real
gateway exposition."""

from __future__ import annotations

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.alerts.spec import DEFAULT
from inferwatch.serving.metrics import create_metrics
from inferwatch.serving.vllm_metrics import VLLM_METRICS


@pytest.mark.vllm
def test_every_vllm_metric_we_read_is_exported_by_the_pinned_vllm(vllm_server):
    text = requests.get(f"{vllm_server.url}/metrics", timeout=10).text
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    missing = {name: kind for name, kind in VLLM_METRICS.items() if families.get(name) != kind}
    assert not missing, f"vLLM does not export these as declared (name: declared kind): {missing}"


def test_latency_slo_buckets_are_boundaries_the_gateway_exposes():
    registry = CollectorRegistry()
    m = create_metrics(registry)
    m.signals["ttft"].labels("m", "v", "/v1/chat/completions").observe(0.3)
    m.request_duration.labels("m", "v", "/v1/chat/completions", "2xx").observe(3)
    buckets = {(s.name, s.labels["le"]) for f in text_string_to_metric_families(generate_latest(registry).decode())
               for s in f.samples if s.name.endswith("_bucket")}
    for slo in DEFAULT.slos:
        if slo.good is not None:
            name = slo.good.split("{", 1)[0]
            le = slo.good.split('le="')[1].split('"')[0]
            assert (name, le) in buckets, f"{slo.name}: no {name} bucket le={le!r} in the gateway's exposition"
