"""Spans encoded on the event loop a few at a time and sent from a thread
(serving/span_export.py), against a real OTLP/HTTP receiver on loopback: every span
arrives whole, the encoded slices joined are one valid export request, a few spans on a
quiet gateway arrive by the timer, and shutdown sends what is left. The SDK's OTLP/HTTP
exporter is the one that can take bytes (its private HTTP client is pinned here: an
upgrade that drops it fails this test, and the gateway would fall back to the SDK's own
batch processor)."""

from __future__ import annotations

import socket
import time

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, Counter

from inferwatch.serving import span_export
from inferwatch.serving.metrics import create_metrics
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.span_export import LoopEncodingSpanProcessor, loop_encoding
from inferwatch.serving.tracing import build_tracer_provider, otlp_exporter


def dropped_counter() -> tuple[CollectorRegistry, Counter]:
    registry = CollectorRegistry()
    return registry, create_metrics(registry).spans_dropped


def provider(exporter: SpanExporter) -> tuple[TracerProvider, CollectorRegistry]:
    registry, dropped = dropped_counter()
    tp = TracerProvider(resource=Resource.create({"service.name": "inferwatch-test"}))
    tp.add_span_processor(LoopEncodingSpanProcessor(exporter, dropped))
    return tp, registry


def dropped(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("inferwatch_gateway_spans_dropped_total")


def test_the_gateway_encodes_on_the_loop_only_with_an_exporter_that_takes_bytes(receiver):
    assert loop_encoding(otlp_exporter(receiver.endpoint, "http/protobuf"))
    assert not loop_encoding(InMemorySpanExporter())
    assert not loop_encoding(otlp_exporter("http://127.0.0.1:4317", "grpc"))
    (chosen,) = build_tracer_provider(GatewaySettings(otlp_endpoint=receiver.endpoint), dropped_counter()[1]) \
        ._active_span_processor._span_processors
    assert isinstance(chosen, LoopEncodingSpanProcessor)


def test_every_span_arrives_and_each_export_is_one_request(receiver):
    tp, registry = provider(otlp_exporter(receiver.endpoint, "http/protobuf"))
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
    assert dropped(registry) == 0
    tp.shutdown()


def test_a_few_spans_arrive_by_the_timer_and_shutdown_sends_the_rest(receiver):
    tp, _ = provider(otlp_exporter(receiver.endpoint, "http/protobuf"))
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


def test_spans_past_the_queue_of_a_stalled_collector_are_dropped_and_counted(monkeypatch):
    """A collector that takes the connection and never answers: the export thread waits in
    its post, slices pile up to the bound, and what comes after is counted, not queued."""
    monkeypatch.setattr(span_export, "MAX_QUEUED_SLICES", 3)
    monkeypatch.setattr(span_export, "BATCH_SLICES", 1)
    with socket.create_server(("127.0.0.1", 0)) as stalled:  # listens, never accepts: connects, no answer
        endpoint = f"http://127.0.0.1:{stalled.getsockname()[1]}/v1/traces"
        tp, registry = provider(OTLPSpanExporter(endpoint=endpoint, timeout=1))
        tracer = tp.get_tracer("t")
        for i in range(span_export.SLICE):  # one slice: the thread takes it and hangs in the post
            tracer.start_span(f"first {i}").end()
        time.sleep(0.2)
        for i in range(5 * span_export.SLICE):  # three slices wait, two are dropped
            tracer.start_span(f"later {i}").end()
        assert dropped(registry) == 2 * span_export.SLICE
        tp.shutdown()
