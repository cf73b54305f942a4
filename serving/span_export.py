"""Spans encoded where they end, on the event loop, a few at a time; sent from a thread.

The SDK's ``BatchSpanProcessor`` encodes a batch on its own thread: 64 spans are ~3.4 ms of
Python in the OTLP encoder, and the event loop, sharing the GIL and on a small pod the core,
waited for it in turns. That was most of the gateway's p99 with 10 % of traces at one
request at a time (3.5–4.5 ms, bench/gateway_overhead.py). Here every ``SLICE`` spans are
encoded at once (by span_wire, straight to protobuf's wire format) when the last of them
ends (after its request's answer was written), which holds the loop ~0.1 ms at a time, and
a thread only joins the encoded slices and posts them, which is I/O: protobuf messages
concatenated are one message with the repeated fields of both, so the joined slices are
one ``ExportTraceServiceRequest``.

The post goes through the SDK exporter's own HTTP client (its headers, compression,
timeout and retries from the ``OTEL_EXPORTER_OTLP_*`` settings): ``OTLPSpanExporter._client``
is not public API, so ``loop_encoding`` says whether this exporter has it, and the gateway
keeps the SDK's processor otherwise (tests/serving/test_span_export.py pins it).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client import Counter

from inferwatch.serving.span_wire import SpanWriter

log = logging.getLogger(__name__)

SLICE = 4  # spans encoded at once: ~0.1 ms of the loop (span_wire; the SDK's encoder took 0.25)
BATCH_SLICES = 16  # slices per export: 64 spans, as the SDK processor was set
MAX_QUEUED_SLICES = 512  # 2,048 spans waiting, the SDK's default queue; more are dropped
SCHEDULE_S = 0.2


def loop_encoding(exporter: SpanExporter) -> bool:
    """Whether this exporter can send bytes encoded elsewhere (the OTLP/HTTP one can)."""
    return callable(getattr(getattr(exporter, "_client", None), "export", None))


class LoopEncodingSpanProcessor(SpanProcessor):
    def __init__(self, exporter: SpanExporter, dropped: Counter) -> None:
        self._exporter = exporter
        self._writer = SpanWriter()
        self._client: Any = exporter._client  # type: ignore[attr-defined]  # see loop_encoding
        self._ended: list[ReadableSpan] = []  # sampled spans not encoded yet
        self._lock = threading.Lock()  # spans end on the loop; the thread takes the stragglers
        self._sending = threading.Lock()  # the thread, or a flush on another
        self._slices: deque[bytes] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._warned = False
        self._dropped = dropped  # spans, when the collector is slower than the gateway for long
        self._thread = threading.Thread(target=self._run, name="inferwatch-span-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled or self._stopping:
            return
        with self._lock:
            self._ended.append(span)
            if len(self._ended) < SLICE:
                return
            spans, self._ended = self._ended, []
        self._queue(spans)

    def _queue(self, spans: list[ReadableSpan]) -> None:
        if len(self._slices) >= MAX_QUEUED_SLICES:
            if not self._warned:
                self._warned = True
                log.warning("spans are dropped (inferwatch_gateway_spans_dropped_total): the trace collector "
                            "takes them slower than they come")
            self._dropped.inc(len(spans))
            return
        try:
            self._slices.append(self._writer.request(spans))
        except Exception:  # something span_wire does not write: the SDK's encoder, as it would
            try:
                self._slices.append(encode_spans(spans).SerializePartialToString())
            except Exception:  # a span neither encodes: lost, and the request that ended it is not
                log.exception("%d spans could not be encoded", len(spans))
                self._dropped.inc(len(spans))
                return
        if len(self._slices) >= BATCH_SLICES:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(SCHEDULE_S)
            self._wake.clear()
            self.force_flush()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """What ended is encoded and sent now, on the caller's thread: on the export thread
        every ``SCHEDULE_S``, fewer than ``SLICE`` spans that waited (a quiet gateway's)."""
        with self._lock:
            spans, self._ended = self._ended, []
        if spans:
            self._queue(spans)
        with self._sending:
            slices = self._slices
            while slices:
                body = b"".join(slices.popleft() for _ in range(min(BATCH_SLICES, len(slices))))
                try:
                    self._client.export(body)  # logs its own failures, after its retries
                except Exception:  # the collector's trouble must stay the traces' trouble
                    log.exception("span export failed")
        return True

    def shutdown(self) -> None:
        if self._stopping:  # the gateway's stop, then the SDK's at exit
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=5)
        self.force_flush()
        self._exporter.shutdown()
