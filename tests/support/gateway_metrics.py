"""The gateway's metrics as a busy gateway has them, for the exposition tests and the
/metrics render benchmark (bench/gateway_overhead.py) to measure the same registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from inferwatch.serving.metrics import create_metrics


def populated_registry(models: int, variants: int) -> CollectorRegistry:
    """Every route and status class seen per model and variant, with exemplars."""
    registry = CollectorRegistry()
    m = create_metrics(registry)
    for model in (f"model-{i}" for i in range(models)):
        for variant in (f"v{i}" for i in range(variants)):
            for route in ("/v1/chat/completions", "/v1/completions"):
                tok = (model, variant, route)
                for sc in ("2xx", "4xx", "5xx"):
                    m.requests.labels(*tok, sc).inc(100)
                    for i in range(50):
                        m.request_duration.labels(*tok, sc).observe(0.01 * i, {"trace_id": f"{i:032x}"})
                for i in range(200):
                    m.signals["ttft"].labels(*tok).observe(0.005 * i, {"trace_id": f"{i:032x}"})
                    m.signals["itl"].labels(*tok).observe(0.001 * i)
                    m.signals["tpot"].labels(*tok).observe(0.001 * i)
                    m.signals["prompt_tokens"].labels(*tok).observe(i * 10)
                    m.signals["completion_tokens"].labels(*tok).observe(i * 3)
                m.input_tokens.labels(*tok).inc(1e6)
                m.output_tokens.labels(*tok).inc(1e6)
            m.in_flight.labels(model, variant).set(3)
            for reason in ("connect", "timeout", "stream_interrupted"):
                m.upstream_errors.labels(model, variant, reason).inc()
    return registry
