"""A real OTLP/HTTP receiver on loopback, of traces and metrics, so tests see exactly what
exporters send."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict
    events: tuple[str, ...]
    status_code: int
    end_ns: int = 0
    event_ns: dict | None = None  # event name -> time (unix ns)


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class GrpcOTLPReceiver:
    """The same, over OTLP/gRPC (what collectors listen on at 4317)."""

    def __init__(self) -> None:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        self.spans = OTLPReceiver.__new__(OTLPReceiver)
        self.spans.spans, self.spans._lock = [], threading.Lock()
        receiver = self.spans

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                receiver._add(request)
                return ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server.start()

    def close(self) -> None:
        self._server.stop(grace=None)


class OTLPReceiver:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.spans: list[ReceivedSpan] = []
        self.payloads: list[bytes] = []  # every export as received (un-gzipped): what reached the wire
        self.metric_requests: list[ExportMetricsServiceRequest] = []  # every metrics export
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/metrics":
                    metrics = ExportMetricsServiceRequest()
                    metrics.ParseFromString(body)
                    with receiver._lock:
                        receiver.metric_requests.append(metrics)
                    self._answer(ExportMetricsServiceResponse().SerializeToString())
                    return
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                with receiver._lock:
                    receiver.payloads.append(body)
                receiver._add(req)
                self._answer(ExportTraceServiceResponse().SerializeToString())

            def _answer(self, out: bytes) -> None:
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args) -> None:
                return None

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://{host}:{self.port}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _add(self, req: ExportTraceServiceRequest) -> None:
        spans = []
        for rs in req.resource_spans:
            service = next((_value(a.value) for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(ReceivedSpan(
                        service=service, name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(), kind=s.kind,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        events=tuple(e.name for e in s.events), status_code=s.status.code,
                        end_ns=s.end_time_unix_nano, event_ns={e.name: e.time_unix_nano for e in s.events},
                    ))
        with self._lock:
            self.spans.extend(spans)

    def histograms(self) -> dict[str, list[tuple[dict, object]]]:
        """Every histogram data point received, by metric name: (attributes, the point)."""
        out: dict[str, list[tuple[dict, object]]] = {}
        with self._lock:
            requests = list(self.metric_requests)
        for req in requests:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        for point in metric.histogram.data_points:
                            out.setdefault(metric.name, []).append(
                                ({a.key: _value(a.value) for a in point.attributes}, point))
        return out

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, predicate, timeout_s: float = 15.0) -> list[ReceivedSpan]:
        """Poll until ``predicate(all spans)`` returns a truthy list, or fail with what arrived."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                snapshot = list(self.spans)
            found = predicate(snapshot)
            if found:
                return found
            if time.monotonic() > deadline:
                names = sorted({(s.service, s.name) for s in snapshot})
                raise AssertionError(f"spans not received within {timeout_s}s; got {names}")
            time.sleep(0.1)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
