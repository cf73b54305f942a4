"""The per-tenant metrics: who sends the load, what it is served, and whether within its
model's objectives (serving/goodput.py).

Labelled ``tenant`` and ``model`` only: tenants are the limits file's declared names and
``other`` and ``anonymous`` (serving/tenants.py), models the ones vLLM serves, so the series
are bounded by declarations, never by what clients send. Routes, variants and status codes
stay on the per-model metrics: multiplied by tenants they would cost more than they tell.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from inferwatch.common.latency_buckets import REQUEST_DURATION_BUCKETS, TTFT_BUCKETS
from inferwatch.serving.errors import STATUS_CLASSES

NAMESPACE = "inferwatch_gateway"
TENANT_LABELS = ("tenant", "model")
# Coarser than the per-model histograms' (a subset of their boundaries): with 50 tenants and 4
# models, the full sets made the tenants' series 4x the rest of /metrics and its render 7x
# slower (bench/gateway_overhead.py). Goodput, which judges each request at the objectives'
# exact thresholds, does not read them; they answer "is this tenant's p95 a second or ten".
TENANT_TTFT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20)
TENANT_DURATION_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120)
assert set(TENANT_TTFT_BUCKETS) <= set(TTFT_BUCKETS) and set(TENANT_DURATION_BUCKETS) <= set(REQUEST_DURATION_BUCKETS)


@dataclass(frozen=True)
class TenantMetrics:
    requests: Counter
    input_tokens: Counter
    output_tokens: Counter
    cached_tokens: Counter
    ttft: Histogram
    duration: Histogram
    goodput_requests: Counter
    goodput_output_tokens: Counter


def create_tenant_metrics(registry: CollectorRegistry) -> TenantMetrics:
    def counter(name: str, doc: str, labels: tuple[str, ...] = TENANT_LABELS) -> Counter:
        return Counter(name, doc, labels, namespace=NAMESPACE, registry=registry)

    return TenantMetrics(
        requests=counter("tenant_requests", "Requests answered, by tenant, model and status class.",
                         (*TENANT_LABELS, "status_class")),
        input_tokens=counter("tenant_input_tokens", "Prompt tokens by tenant and model, from vLLM's usage (the "
                             "prompt once per choice, as inferwatch_gateway_input_tokens_total)."),
        output_tokens=counter("tenant_output_tokens", "Generated tokens by tenant and model, from vLLM's usage."),
        cached_tokens=counter("tenant_cached_input_tokens", "Prompt tokens vLLM found in its prefix cache "
                              "(usage.prompt_tokens_details.cached_tokens; vLLM reports it with "
                              "--enable-prompt-tokens-details), by tenant and model."),
        ttft=Histogram("tenant_time_to_first_token_seconds", "Time to first token of streamed answers (2xx), by "
                       "tenant and model.", TENANT_LABELS, namespace=NAMESPACE, buckets=TENANT_TTFT_BUCKETS,
                       registry=registry),
        duration=Histogram("tenant_request_duration_seconds", "Request received to last byte sent, by tenant and "
                           "model.", TENANT_LABELS, namespace=NAMESPACE, buckets=TENANT_DURATION_BUCKETS,
                           registry=registry),
        goodput_requests=counter("goodput_requests", "Requests answered 2xx within every latency objective of their "
                                 "model together (TTFT, time per output token, end to end; serving/goodput.py), by "
                                 "tenant and model."),
        goodput_output_tokens=counter("goodput_output_tokens", "Generated tokens of the requests counted in "
                                      "inferwatch_gateway_goodput_requests_total."),
    )


class TenantSeries:
    """The children of one (tenant, model), looked up once (``labels()`` costs more than the
    update it leads to)."""

    __slots__ = ("_requests", "by_status", "cached_tokens", "duration", "good", "good_tokens", "input_tokens", "output_tokens",
                 "ttft")

    def __init__(self, m: TenantMetrics, tenant: str, model: str) -> None:
        self._requests = (m.requests, tenant, model)
        self.by_status = {c: m.requests.labels(tenant, model, c) for c in STATUS_CLASSES}
        self.input_tokens = m.input_tokens.labels(tenant, model)
        self.output_tokens = m.output_tokens.labels(tenant, model)
        self.cached_tokens = m.cached_tokens.labels(tenant, model)
        self.ttft = m.ttft.labels(tenant, model)
        self.duration = m.duration.labels(tenant, model)
        self.good = m.goodput_requests.labels(tenant, model)
        self.good_tokens = m.goodput_output_tokens.labels(tenant, model)

    def answered(self, status_class: str) -> Counter:
        child = self.by_status.get(status_class)
        if child is None:
            counter, tenant, model = self._requests
            child = self.by_status[status_class] = counter.labels(tenant, model, status_class)
        return child
