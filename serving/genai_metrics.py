"""OpenTelemetry's GenAI metrics, for teams whose observability reads the semantic conventions.

They are still experimental, so they are off unless ``OTEL_SEMCONV_STABILITY_OPT_IN`` names
``gen_ai_latest_experimental``: the switch OpenTelemetry's own instrumentations use for
conventions that may still change. The names, units and attributes are those of semantic
conventions **v1.44.0**, which ``opentelemetry-semantic-conventions`` 0.66b2 (a dependency of
the SDK, pinned in requirements.lock) generates: the names come from that package, not from
strings of our own. The bucket boundaries are the conventions' advice for each histogram.

The gateway is both sides of the conventions at once: the ``gen_ai.server.*`` histograms
measure it as the server its clients call (its own time included), the ``gen_ai.client.*``
ones as vLLM's client. They are exported over OTLP beside the spans (``otlp_endpoint``);
Prometheus keeps reading the gateway's own metrics, which these do not replace.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry.metrics import Histogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as names
from opentelemetry.semconv.attributes import error_attributes, server_attributes

from inferwatch import __version__
from inferwatch.serving.settings import GatewaySettings

log = logging.getLogger(__name__)

OPT_IN = "gen_ai_latest_experimental"
SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"
PROVIDER = "vllm"

# the conventions' advice (explicit_bucket_boundaries_advisory) per histogram
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)


def opted_in(environ: Mapping[str, str] = os.environ) -> bool:
    """``OTEL_SEMCONV_STABILITY_OPT_IN`` is a comma-separated list, as the instrumentations read it."""
    return OPT_IN in {v.strip() for v in environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "").split(",")}


def otlp_metric_exporter(endpoint: str, protocol: str) -> MetricExporter:
    """The traces' endpoint, for metrics: http/protobuf posts to …/v1/metrics beside
    …/v1/traces; grpc takes the same host:port."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    base = endpoint.rstrip("/").removesuffix("/v1/traces")
    return HttpExporter(endpoint=base + "/v1/metrics")


def genai_metrics(settings: GatewaySettings, environ: Mapping[str, str] = os.environ) -> GenAIMetrics | None:
    """The metrics, if opted in and there is an OTLP endpoint to send them to. They go out every
    ``OTEL_METRIC_EXPORT_INTERVAL`` milliseconds (the SDK's variable; 60 s by default) and when
    the gateway stops."""
    if not opted_in(environ):
        return None
    if not settings.otlp_endpoint:
        log.warning("OTEL_SEMCONV_STABILITY_OPT_IN names %s, but there is no OTLP endpoint to send the GenAI "
                    "metrics to: set INFERWATCH_GATEWAY_OTLP_ENDPOINT (--otlp-endpoint)", OPT_IN)
        return None
    interval_ms = environ.get("OTEL_METRIC_EXPORT_INTERVAL", "60000")
    try:
        interval_s = float(interval_ms) / 1000
    except ValueError:
        interval_s = 0
    if not 0 < interval_s < float("inf"):  # as the SDK takes a bad value: said, and the default used
        log.warning("OTEL_METRIC_EXPORT_INTERVAL is %r, not a positive number of milliseconds: exporting every 60 s",
                    interval_ms)
        interval_s = 60.0
    return GenAIMetrics(otlp_metric_exporter(settings.otlp_endpoint, settings.otlp_protocol), settings.service_name,
                        interval_s)


class GenAIMetrics:
    """The five histograms of the conventions the gateway can measure, recorded once per
    request when it ends (serving/recording.py)."""

    def __init__(self, exporter: MetricExporter, service_name: str, export_interval_s: float = 60.0) -> None:
        self.provider = MeterProvider(
            resource=Resource.create({"service.name": service_name, "service.version": __version__}),
            metric_readers=[PeriodicExportingMetricReader(exporter, export_interval_millis=export_interval_s * 1000)])
        meter = self.provider.get_meter("inferwatch.serving", __version__, schema_url=SCHEMA_URL)

        def histogram(name: str, unit: str, description: str, buckets: tuple[float, ...]) -> Histogram:
            return meter.create_histogram(name, unit, description, explicit_bucket_boundaries_advisory=buckets)

        self.server_duration = histogram(names.GEN_AI_SERVER_REQUEST_DURATION, "s",
                                         "Generative AI server request duration such as time-to-last byte or last "
                                         "output token.", DURATION_BUCKETS)
        self.server_ttft = histogram(names.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, "s",
                                     "Time to generate first token for successful responses.", TTFT_BUCKETS)
        self.server_tpot = histogram(names.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, "s",
                                     "Time per output token generated after the first token for successful "
                                     "responses.", TPOT_BUCKETS)
        self.client_duration = histogram(names.GEN_AI_CLIENT_OPERATION_DURATION, "s", "GenAI operation duration.",
                                         DURATION_BUCKETS)
        self.client_tokens = histogram(names.GEN_AI_CLIENT_TOKEN_USAGE, "{token}",
                                       "Number of input and output tokens used.", TOKEN_BUCKETS)

    def record(self, *, operation: str, model: str, response_model: str | None, status: int, e2e_s: float,
               upstream: tuple[str, int, float] | None, ttft_s: float | None, tpot_s: float | None,
               input_tokens: int | None, output_tokens: int | None) -> None:
        """One request. ``upstream``: vLLM's address, port and the call's duration, if the
        request reached vLLM; ``status`` >= 400 is the ``error.type``, as HTTP's conventions
        name a failed request's class by its status code."""
        attrs: dict[str, str | int] = {gen_ai.GEN_AI_OPERATION_NAME: operation, gen_ai.GEN_AI_PROVIDER_NAME: PROVIDER,
                                       gen_ai.GEN_AI_REQUEST_MODEL: model}
        if response_model is not None:
            attrs[gen_ai.GEN_AI_RESPONSE_MODEL] = response_model
        if status >= 400:
            attrs[error_attributes.ERROR_TYPE] = str(status)
        self.server_duration.record(e2e_s, attrs)
        if status < 400:
            if ttft_s is not None:
                self.server_ttft.record(ttft_s, attrs)
            if tpot_s is not None:
                self.server_tpot.record(tpot_s, attrs)
        if upstream is None:
            return
        address, port, call_s = upstream
        client = {**attrs, server_attributes.SERVER_ADDRESS: address, server_attributes.SERVER_PORT: port}
        self.client_duration.record(call_s, client)
        for kind, tokens in ((gen_ai.GenAiTokenTypeValues.INPUT.value, input_tokens),
                             (gen_ai.GenAiTokenTypeValues.OUTPUT.value, output_tokens)):
            if tokens is not None:
                self.client_tokens.record(tokens, {**client, gen_ai.GEN_AI_TOKEN_TYPE: kind})

    def shutdown(self) -> None:
        """Export what is recorded, then stop."""
        self.provider.shutdown()
