"""The gateway's own trace-context writer against OpenTelemetry's W3C propagator."""

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from serving.tracing import PROPAGATOR, get_tracer, inject_context

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
