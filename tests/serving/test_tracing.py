"""The gateway's own trace-context writer against OpenTelemetry's W3C propagator."""

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from prometheus_client import CollectorRegistry

from inferwatch.serving.metrics import create_metrics
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.tracing import PROPAGATOR, ServerSpans, build_tracer_provider, get_tracer, inject_context

INCOMING = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "tracestate": "vendor=abc,other=x1"}


def _spans():
    parent = PROPAGATOR.extract(INCOMING)
    for name, tracer in (("no-op", get_tracer(None)),
                         ("sampled", TracerProvider(sampler=ALWAYS_ON).get_tracer("t")),
                         ("sampled out", TracerProvider(sampler=ALWAYS_OFF).get_tracer("t"))):
        yield f"{name}, continuing", tracer.start_span("s", context=parent)
        yield f"{name}, new trace", tracer.start_span("s", context=PROPAGATOR.extract({}))
    yield "invalid", trace.INVALID_SPAN
    yield "no trace state", NonRecordingSpan(SpanContext(1, 2, False, TraceFlags(0)))
    yield "trace state", NonRecordingSpan(SpanContext(2**128 - 1, 2**64 - 1, False, TraceFlags(1),
                                                      TraceState([("k", "v")])))


@pytest.mark.parametrize("name, span", list(_spans()))
def test_inject_context_writes_what_the_propagator_writes(name, span):
    ours, theirs = {"content-type": "application/json"}, {"content-type": "application/json"}
    inject_context(ours, span)
    PROPAGATOR.inject(theirs, context=trace.set_span_in_context(span))
    assert ours == theirs


def _server_spans(ratio: float) -> ServerSpans:
    provider = build_tracer_provider(GatewaySettings(otlp_endpoint="http://127.0.0.1:9", trace_sample_ratio=ratio),
                                     create_metrics(CollectorRegistry()).spans_dropped, InMemorySpanExporter())
    return ServerSpans(get_tracer(provider), ratio, sdk=True)


@pytest.mark.parametrize("ratio", [0.0, 0.25, 1.0])
def test_new_traces_are_sampled_at_the_ratio(ratio):
    spans = _server_spans(ratio)
    n = 4000
    recorded = [spans.start("s", PROPAGATOR.extract({}), {}) for _ in range(n)]
    share = sum(s.is_recording() for s in recorded) / n
    sigma = (ratio * (1 - ratio) / n) ** 0.5
    assert abs(share - ratio) <= 4.5 * sigma  # binomial: exact at 0 and 1
    contexts = [s.get_span_context() for s in recorded]
    assert all(c.is_valid and c.trace_flags.sampled == s.is_recording() for c, s in zip(contexts, recorded))
    assert len({c.trace_id for c in contexts}) == n  # every request its own trace


@pytest.mark.parametrize("flags, ratio, recorded", [("01", 0.0, True), ("00", 1.0, False)])
def test_a_clients_trace_keeps_its_sampling_decision(flags, ratio, recorded):
    incoming = {"traceparent": f"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-{flags}"}
    span = _server_spans(ratio).start("s", PROPAGATOR.extract(incoming), {})
    assert span.is_recording() is recorded
    assert span.get_span_context().trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    headers = {}
    inject_context(headers, span)
    assert headers["traceparent"].endswith(f"-{flags}")  # vLLM follows the same decision


def test_without_tracing_the_clients_context_passes_through():
    incoming = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    span = ServerSpans(get_tracer(None), 1.0, sdk=False).start("s", PROPAGATOR.extract(incoming), {})
    headers = {}
    inject_context(headers, span)
    assert headers == incoming and not span.is_recording()
