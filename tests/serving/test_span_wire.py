"""Spans written straight to protobuf (serving/span_wire.py) against the SDK's own OTLP
encoder: what ours writes, parsed by protobuf, is the message ``encode_spans`` builds, for
hand-picked cases at every edge of the format, for attributes hypothesis makes up, and for
the spans the gateway itself makes on a real request; what ours does not write goes to the
SDK's encoder, which keeps the span and drops the attribute, as the SDK would."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from inferwatch.serving import span_wire
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.span_wire import SpanWriter, Unencodable
from inferwatch.serving.tracing import otlp_exporter
from tests.serving.test_gateway_faults import chat
from tests.serving.test_span_export import dropped, provider as processed_by_the_gateways
from tests.support.otlp import OTLPReceiver
from tests.support.servers import GatewayServer

INT64_MAX = 2**63 - 1


def recorded(resource: Resource | None = None, limits: SpanLimits | None = None) -> tuple[TracerProvider,
                                                                                          InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=resource or Resource.create({"service.name": "wire"}),
                              span_limits=limits or SpanLimits())
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


def assert_same_as_sdk(spans: list[ReadableSpan]) -> ExportTraceServiceRequest:
    ours = ExportTraceServiceRequest.FromString(SpanWriter().request(spans))
    assert ours == encode_spans(spans)
    return ours


REMOTE = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True,
                     trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", "abc"), ("other", "x1")]))


def test_every_field_of_a_span_as_the_sdk_writes_it():
    provider, memory = recorded(Resource.create({"service.name": "wire", "n": 3, "ratio": 0.5}, "https://s/1"))
    tracer = provider.get_tracer("inferwatch.gateway", "1.2.3", schema_url="https://s/2",
                                 attributes={"scope.attr": True})
    attributes = {"s": "text", "empty": "", "unicode": "żółw 🐢 语", "t": True, "f": False, "zero": 0,
                  "int": 42, "neg": -5, "max": INT64_MAX, "min": -(2**63), "float": 2.5, "negzero": -0.0,
                  "inf": math.inf, "strs": ["a", "", "b"], "ints": [1, -2, 3], "floats": [0.5], "bools": [True, False],
                  "long": "x" * 300, "nothing": []}
    with tracer.start_as_current_span("server", context=set_span_in_context(NonRecordingSpan(REMOTE)),
                                      kind=SpanKind.SERVER, attributes=attributes,
                                      links=[Link(REMOTE, {"why": "batch"}),
                                             Link(SpanContext(1, 2, is_remote=False))]) as server:
        server.add_event("first token", {"ttft_s": 0.12}, timestamp=1_700_000_000_000_000_000)
        server.add_event("no attributes")
        for kind in (SpanKind.CLIENT, SpanKind.INTERNAL, SpanKind.PRODUCER, SpanKind.CONSUMER):
            with tracer.start_as_current_span(f"child {kind.name}", kind=kind) as child:
                child.set_status(Status(StatusCode.ERROR, "upstream said 500"))
        server.set_status(Status(StatusCode.OK))
    with tracer.start_as_current_span(""):  # no name, new trace, no parent, unset status
        pass
    spans = list(memory.get_finished_spans())
    message = assert_same_as_sdk(spans)
    (server_span,) = [s for s in message.resource_spans[0].scope_spans[0].spans if s.name == "server"]
    assert server_span.flags == 0x300 and server_span.trace_state == "vendor=abc,other=x1"  # the test tests


def test_dropped_counts_and_several_resources_and_scopes_in_one_request():
    limited, memory = recorded(limits=SpanLimits(max_span_attributes=2, max_events=1, max_links=1,
                                                 max_event_attributes=1, max_link_attributes=1))
    other, other_memory = recorded(Resource.create({"service.name": "other"}))
    with limited.get_tracer("a").start_as_current_span("many", attributes={"a": 1, "b": 2, "c": 3},
                                                       links=[Link(REMOTE, {"x": 1, "y": 2}), Link(REMOTE)]) as s:
        s.add_event("e1", {"p": 1, "q": 2})
        s.add_event("e2")
    limited.get_tracer("b", "2").start_span("second scope").end()
    other.get_tracer("a").start_span("second resource").end()
    spans = [*memory.get_finished_spans(), *other_memory.get_finished_spans()]
    message = assert_same_as_sdk(spans)
    assert len(message.resource_spans) == 2 and len(message.resource_spans[0].scope_spans) == 2
    assert message.resource_spans[0].scope_spans[0].spans[0].dropped_attributes_count == 1


SCALARS = st.one_of(st.text(), st.booleans(), st.integers(-(2**63), INT64_MAX),
                    st.floats(allow_nan=False), st.binary(max_size=20))


@settings(max_examples=200, deadline=None)
@given(attributes=st.dictionaries(st.text(), st.one_of(SCALARS, st.lists(st.text(), max_size=4),
                                                       st.lists(st.integers(-(2**63), INT64_MAX), max_size=4),
                                                       st.lists(st.floats(allow_nan=False), max_size=4)),
                                  max_size=8),
       name=st.text(), description=st.one_of(st.none(), st.text()))
def test_made_up_attributes_as_the_sdk_writes_them(attributes, name, description):
    provider, memory = recorded()
    with provider.get_tracer("t").start_as_current_span(name, attributes=attributes) as s:
        s.add_event(name, attributes)
        s.set_status(Status(StatusCode.ERROR, description))
    assert_same_as_sdk(list(memory.get_finished_spans()))  # hypothesis's text has no lone surrogates


@pytest.mark.parametrize("value", [2**64, "lone \ud800 surrogate"])
def test_what_ours_cannot_write_goes_to_the_sdk_which_drops_only_the_attribute(value, receiver):
    """The processor's fallback: the span arrives with its other attributes."""
    provider, registry = processed_by_the_gateways(otlp_exporter(receiver.endpoint, "http/protobuf"))
    with pytest.raises(Unencodable):
        span_wire._any_value(value)
    provider.get_tracer("t").start_span("odd", attributes={"odd": value, "kept": "yes"}).end()
    provider.shutdown()
    (span,) = receiver.wait_for(lambda got: [s for s in got if s.name == "odd"])
    assert span.attributes == {"kept": "yes"}
    assert dropped(registry) == 0


def test_the_gateways_own_spans_as_the_sdk_writes_them(stub, monkeypatch):
    """A real gateway's server and upstream spans, for a success, an upstream error and a
    stream, through the processor it uses for OTLP/HTTP: each slice it wrote is compared."""
    compared: list[int] = []
    write = SpanWriter.request

    def checked(self, spans):
        encoded = write(self, spans)
        assert ExportTraceServiceRequest.FromString(encoded) == encode_spans(spans)
        compared.append(len(spans))
        return encoded

    monkeypatch.setattr(SpanWriter, "request", checked)
    receiver = OTLPReceiver()
    try:
        with GatewayServer(GatewaySettings(upstream_url=stub.url, otlp_endpoint=receiver.endpoint)) as gw:
            for model, stream in (("ok", False), ("http500", False), ("ok", True), ("ok", False)):
                response = chat(gw, model=model, stream=stream)
                _ = response.content
            receiver.wait_for(lambda got: len(got) >= 8)
        names = {s.name for s in receiver.spans}
    finally:
        receiver.close()
    assert {"chat ok", "chat http500"} <= names
    assert sum(compared) >= 8
