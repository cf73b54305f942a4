"""Spans encoded on the event loop a few at a time and sent from a thread
(serving/span_export.py), against a real OTLP/HTTP receiver on loopback: every span
arrives whole, the encoded slices joined are one valid export request, a few spans on a
quiet gateway arrive by the timer, and shutdown sends what is left. The SDK's OTLP/HTTP
exporter is the one that can take bytes (its private HTTP client is pinned here: an
upgrade that drops it fails this test, and the gateway would fall back to the SDK's own
batch processor)."""

from __future__ import annotations

import time

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferwatch.serving import span_export
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.span_export import LoopEncodingSpanProcessor, loop_encoding
from inferwatch.serving.tracing import build_tracer_provider, otlp_exporter
from tests.support.otlp import OTLPReceiver


@pytest.fixture
def receiver():
    r = OTLPReceiver()
    yield r
    r.close()


def provider(receiver: OTLPReceiver) -> tuple[TracerProvider, LoopEncodingSpanProcessor]:
    processor = LoopEncodingSpanProcessor(otlp_exporter(receiver.endpoint, "http/protobuf"))
    tp = TracerProvider(resource=Resource.create({"service.name": "inferwatch-test"}))
    tp.add_span_processor(processor)
    return tp, processor


def test_the_gateway_encodes_on_the_loop_only_with_an_exporter_that_takes_bytes(receiver):
    assert loop_encoding(otlp_exporter(receiver.endpoint, "http/protobuf"))
    assert not loop_encoding(InMemorySpanExporter())
    assert not loop_encoding(otlp_exporter("http://127.0.0.1:4317", "grpc"))
    (chosen,) = build_tracer_provider(GatewaySettings(otlp_endpoint=receiver.endpoint))._active_span_processor \
        ._span_processors
    assert isinstance(chosen, LoopEncodingSpanProcessor)


def test_every_span_arrives_and_each_export_is_one_request(receiver):
    tp, processor = provider(receiver)
    tracer = tp.get_tracer("t")
    count = 3 * span_export.SLICE * span_export.BATCH_SLICES + 3  # several full exports and stragglers
    for i in range(count):
        with tracer.start_as_current_span(f"span {i}", attributes={"i": i, "model": "m"}) as span:
            span.add_event("preprocessed")
    receiver.wait_for(lambda got: len(got) >= count)
    spans = list(receiver.spans)
    assert sorted(s.attributes["i"] for s in spans) == list(range(count))
    assert all(s.name == f"span {s.attributes['i']}" and s.attributes["model"] == "m" for s in spans)
    for payload in receiver.payloads:  # slices joined: one request, at most a batch of spans
        req = ExportTraceServiceRequest.FromString(payload)
        n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        assert 0 < n <= span_export.SLICE * span_export.BATCH_SLICES
        assert {kv.value.string_value for rs in req.resource_spans for kv in rs.resource.attributes
                if kv.key == "service.name"} == {"inferwatch-test"}
    assert processor.dropped == 0
    tp.shutdown()


def test_a_few_spans_arrive_by_the_timer_and_shutdown_sends_the_rest(receiver):
    tp, _ = provider(receiver)
    tracer = tp.get_tracer("t")
    with tracer.start_as_current_span("alone"):
        pass
    t0 = time.monotonic()
    receiver.wait_for(lambda got: [s for s in got if s.name == "alone"], timeout_s=5)
    assert time.monotonic() - t0 < 5 * span_export.SCHEDULE_S
    with tracer.start_as_current_span("last"):
        pass
    tp.shutdown()  # before the timer: shutdown sends it
    assert [s.name for s in receiver.spans if s.name == "last"] == ["last"]
    with tracer.start_as_current_span("after"):
        pass
    assert not [s for s in receiver.spans if s.name == "after"]
