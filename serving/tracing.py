"""OpenTelemetry set-up for the gateway: a private TracerProvider, never the global one.

With no OTLP endpoint the gateway uses a no-op tracer: spans cost nearly nothing, and the
client's own ``traceparent`` still reaches vLLM unchanged, so a trace the client started
still joins vLLM's ``llm_request`` span.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import Counter

from inferwatch import __version__
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.span_export import LoopEncodingSpanProcessor, loop_encoding
from inferwatch.serving.sse import StreamAccount
from inferwatch.serving.validation import ParsedRequest

if TYPE_CHECKING:
    import requests

PROPAGATOR = TraceContextTextMapPropagator()
INSTRUMENTATION = "inferwatch.serving"


def otlp_exporter(endpoint: str, protocol: str) -> SpanExporter:
    """http/protobuf takes the full URL (…/v1/traces is added if missing); grpc host:port."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    if not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return HttpExporter(endpoint=endpoint, session=_export_session(endpoint))


def _export_session(endpoint: str) -> requests.Session:
    """A session that reads the environment's proxies for the endpoint once, at start-up.
    requests would read them, and look for a ~/.netrc on disk, at every export: a file
    system lookup five times a second on the thread that shares the GIL with the event loop
    (about 1 % of the gateway's CPU at a 10 % trace sample, bench/gateway_overhead.py)."""
    import requests  # with the http exporter only, which needs it anyway

    session = requests.Session()
    session.proxies = requests.utils.get_environ_proxies(endpoint)
    session.trust_env = False
    return session


def build_tracer_provider(settings: GatewaySettings, dropped: Counter,
                          exporter: SpanExporter | None = None) -> TracerProvider | None:
    """``dropped`` counts sampled spans lost before export (serving/span_export.py)."""
    if exporter is None:
        if not settings.otlp_endpoint:
            return None
        exporter = otlp_exporter(settings.otlp_endpoint, settings.otlp_protocol)
    provider = TracerProvider(  # new traces are sampled by ServerSpans; the SDK follows the parent's flag
        resource=Resource.create({"service.name": settings.service_name, "service.version": __version__}),
        sampler=ParentBased(ALWAYS_ON),
    )
    if loop_encoding(exporter):  # OTLP/HTTP: encoded on the loop in small slices (serving/span_export.py)
        provider.add_span_processor(LoopEncodingSpanProcessor(exporter, dropped))
    else:
        # Small, frequent batches: the exporter thread encodes a batch while holding the GIL,
        # and a 512-span batch (the SDK default) stalls the event loop for ~30 ms (bench/).
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200,
                                                       max_export_batch_size=64))
    return provider


def get_tracer(provider: TracerProvider | None) -> trace.Tracer:
    if provider is None:
        return trace.NoOpTracer()
    return provider.get_tracer(INSTRUMENTATION, __version__)


class ServerSpans:
    """Starts each request's server span, deciding itself whether a new trace is sampled.

    A trace sampled out still needs ids (vLLM joins it, as sampled out, instead of starting
    its own), but not the SDK's span machinery: at a 10 % sample, the SDK's start of the 90 %
    of spans it then drops cost the gateway more than the 10 % it records
    (bench/gateway_overhead.py). A request that continues a client's trace follows that
    trace's sampled flag, through the SDK's ``ParentBased`` sampler."""

    def __init__(self, tracer: trace.Tracer, sample_ratio: float, sdk: bool) -> None:
        self.tracer, self.ratio, self.sdk = tracer, sample_ratio, sdk

    def start(self, name: str, parent: Context, attributes: dict) -> trace.Span:
        if self.sdk and random.random() >= self.ratio and not trace.get_current_span(parent).get_span_context().is_valid:
            return NonRecordingSpan(SpanContext(random.getrandbits(128) or 1, random.getrandbits(64) or 1, False,
                                                TraceFlags(TraceFlags.DEFAULT)))
        return self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)


def inject_context(headers: dict[str, str], span: trace.Span) -> None:
    """Write ``span``'s W3C trace context into ``headers``: what ``PROPAGATOR.inject`` writes
    for a context holding ``span``, without building that context (once per request, for
    the 90 % of requests a 10 % sample leaves unrecorded too)."""
    ctx = span.get_span_context()
    if ctx.is_valid:
        headers["traceparent"] = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
        if ctx.trace_state:
            headers["tracestate"] = ctx.trace_state.to_header()


def exemplar(span: trace.Span) -> dict[str, str] | None:
    """The trace id as an exemplar for sampled spans, so a histogram bucket links to a trace."""
    ctx = span.get_span_context()
    if not ctx.trace_flags.sampled:
        return None
    return {"trace_id": format(ctx.trace_id, "032x")}


OPERATION = {"chat": "chat", "completions": "text_completion"}  # gen_ai.operation.name per route


def request_attributes(req: ParsedRequest) -> dict:
    """The GenAI client span's request attributes (semantic conventions)."""
    attrs = {
        "gen_ai.operation.name": OPERATION[req.route],
        "gen_ai.provider.name": "vllm",  # gen_ai.system before semantic conventions 1.37
        "gen_ai.request.model": req.model,
        "gen_ai.request.stream": req.stream,
    }
    if req.max_tokens is not None:
        attrs["gen_ai.request.max_tokens"] = req.max_tokens
    for key in ("temperature", "top_p", "seed"):
        value = req.payload.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attrs[f"gen_ai.request.{key}"] = value
    return attrs


def response_attributes(account: StreamAccount, response_id: str | None, response_model: str | None) -> dict:
    """What the answer says of itself (GenAI conventions): its id and model, finish reasons and usage."""
    attrs: dict = {}
    if response_id is not None:
        attrs["gen_ai.response.id"] = response_id
    if response_model is not None:
        attrs["gen_ai.response.model"] = response_model
    if account.prompt_tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = account.prompt_tokens
    if account.completion_tokens is not None:
        attrs["gen_ai.usage.output_tokens"] = account.completion_tokens
    if account.finish_reasons:
        attrs["gen_ai.response.finish_reasons"] = account.finish_reasons
    if account.ttft is not None:
        attrs["gen_ai.server.time_to_first_token"] = account.ttft
    return attrs


def end_response_span(span: trace.Span, account: StreamAccount, response_id: str | None,
                      response_model: str | None) -> None:
    """End the client span of a call vLLM answered, with what the answer says of itself."""
    if span.is_recording():
        span.set_attributes(response_attributes(account, response_id, response_model))
    span.end()


def end_span(span: trace.Span, error: str | None) -> None:
    if error is not None and span.is_recording():
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()
