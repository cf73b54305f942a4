"""Every metric the gateway exports, declared once.

Dashboards and alert rules refer to these names through the metric catalog
(alerts/catalog.py), which fails generation on a name no component declares; a test
checks that nothing downstream uses a name that no component exports.

Buckets are chosen for LLM serving: time to first token spans ~20 ms (short prompt on a
warm GPU) to tens of seconds (long prompt behind a queue); inter-token gaps sit between
a few ms and a few hundred ms; whole requests run up to minutes.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter as Tally
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from inferwatch.common.latency_buckets import REQUEST_DURATION_BUCKETS
from inferwatch.drift.sampling_params import PARAMS, SamplingBins
from inferwatch.serving.adapter_metrics import AdapterMetrics, create_adapter_metrics
from inferwatch.serving.errors import STATUS_CLASSES
from inferwatch.serving.signals import OBSERVED, Signal
from inferwatch.serving.tenant_metrics import NAMESPACE, TenantMetrics, create_tenant_metrics

REQUEST_LABELS = ("model", "variant", "route", "status_class")
UNROUTED = "none"  # the route label of a request refused before any route matched (bounded: never the path)
UNKNOWN_MODEL = "unknown"  # the model label of a request whose model is not (yet) known: keeps labels bounded
TOKEN_LABELS = ("model", "variant", "route")

# Upstream error reasons: a closed set so the label stays bounded.
UPSTREAM_ERROR_REASONS = (
    "connect",  # connection refused / DNS / reset before a response
    "timeout",  # no response headers, body or next chunk in time
    "http_4xx",  # vLLM rejected the request
    "http_5xx",  # vLLM failed
    "stream_interrupted",  # connection lost after the stream started
    "bad_response",  # not JSON / not the shape the OpenAI API promises
)

# What can be wrong with an answer, read while it streams (serving/output_quality.py).
ABNORMAL_KINDS = (
    "empty",  # no text, or whitespace only (an answer with tool calls is not empty)
    "single_token",  # stopped (finish_reason stop) after one token
    "loop",  # the answer ends repeating one span of tokens over and over
)

ENDPOINT_LABELS = ("upstream", "endpoint")
ENDPOINT_ERROR_REASONS = (
    "connect",  # refused, unreachable or timed out before any of the request was sent
    "closed",  # closed the connection after the request was sent, before an answer
    "http_5xx",
    "stream_interrupted",
    "timeout",  # no answer headers in time (upstream_timeout_s, or the stream idle timeout)
    "probe",  # its /health did not answer 200
)


@dataclass(frozen=True)
class GatewayMetrics:
    requests: Counter
    request_duration: Histogram
    signals: dict[str, Histogram]  # per-request signals, by name (serving/signals.py)
    input_tokens: Counter
    output_tokens: Counter
    abnormal_outputs: Counter
    sampling: Counter
    in_flight: Gauge
    upstream_errors: Counter
    rejected: Counter
    upstream_up: Gauge
    endpoint_up: Gauge
    endpoint_in_flight: Gauge
    endpoint_requests: Counter
    endpoint_errors: Counter
    endpoint_ejections: Counter
    upstream_retries: Counter
    feature_records: Counter
    feature_queue_depth: Gauge
    rating_deliveries: Counter
    rating_queue_depth: Gauge
    delivery_failures: Counter
    spans_dropped: Counter
    admission_rejected: Counter
    limits_reload_errors: Counter
    assignments: Counter
    experiment_weight: Gauge
    upstream_weight: Gauge
    variant_served_model: Gauge
    experiment_epoch: Gauge
    feedback: Counter
    shared_state_up: Gauge
    shared_state_errors: Counter
    build: Info
    tenants: TenantMetrics
    adapters: AdapterMetrics


def create_metrics(registry: CollectorRegistry, shared_state: bool = True) -> GatewayMetrics:
    """Register the gateway's metrics on ``registry`` (one registry per app, per test); the
    shared state's only with ``shared_state`` (a gateway without Redis has none to report)."""

    def hist(name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, doc, labels, namespace=NAMESPACE, buckets=buckets, registry=registry)

    return GatewayMetrics(
        requests=Counter(
            "requests", "Requests answered, by model, variant, route and status class (2xx, 4xx, 5xx).",
            REQUEST_LABELS, namespace=NAMESPACE, registry=registry,
        ),
        request_duration=hist(
            "request_duration_seconds", "Time from request received to last byte sent.",
            REQUEST_LABELS, REQUEST_DURATION_BUCKETS,
        ),
        signals={signal.name: hist(signal.metric, signal.doc, TOKEN_LABELS, signal.buckets)
                 for signal in OBSERVED if signal.metric is not None},
        input_tokens=Counter(
            "input_tokens", "Prompt tokens of answered requests, from the upstream usage.",
            TOKEN_LABELS, namespace=NAMESPACE, registry=registry,
        ),
        output_tokens=Counter(
            "output_tokens", "Generated tokens of answered requests, from the upstream usage.",
            TOKEN_LABELS, namespace=NAMESPACE, registry=registry,
        ),
        abnormal_outputs=Counter(
            "abnormal_outputs", "Answers (2xx) by what is wrong with them: " + ", ".join(ABNORMAL_KINDS) + ".",
            (*TOKEN_LABELS, "kind"), namespace=NAMESPACE, registry=registry,
        ),
        sampling=Counter(
            "sampling_requests", "Requests by sampling parameter and its bin (drift/sampling_params.py): "
            "temperature, top_p, max_tokens, n, stream, tools, response_format.",
            ("model", "variant", "param", "value"), namespace=NAMESPACE, registry=registry,
        ),
        in_flight=Gauge(
            "requests_in_flight", "Requests being answered right now.", ("model", "variant"),
            namespace=NAMESPACE, registry=registry, multiprocess_mode="livesum",
        ),
        upstream_errors=Counter(
            "upstream_errors", "Failed upstream calls, by reason: " + ", ".join(UPSTREAM_ERROR_REASONS) + ".",
            ("model", "variant", "reason"), namespace=NAMESPACE, registry=registry,
        ),
        rejected=Counter(
            "rejected_requests", "Requests refused by the gateway before reaching upstream, by error code.",
            ("route", "code"), namespace=NAMESPACE, registry=registry,
        ),
        upstream_up=Gauge(
            "upstream_up", "1 if the last model-list probe of the upstream succeeded.",
            ("upstream",), namespace=NAMESPACE, registry=registry,
        ),
        # a variant's replicas (serving/upstream_balancer.py): endpoint is ip:port, at most
        # upstream_max_endpoints per upstream, and a replica gone from DNS takes its series along
        endpoint_up=Gauge(
            "upstream_endpoint_up", "1 while the vLLM replica is in rotation; 0 while it is taken out (a failed "
            "connect, 5xx or broken streams in a row, a failed /health probe) until a probe finds it healthy.",
            ENDPOINT_LABELS, namespace=NAMESPACE, registry=registry,
        ),
        endpoint_in_flight=Gauge(
            "upstream_endpoint_requests_in_flight", "Requests this gateway has at the vLLM replica now: what "
            "least-outstanding balancing compares.", ENDPOINT_LABELS, namespace=NAMESPACE, registry=registry,
        ),
        endpoint_requests=Counter(
            "upstream_endpoint_requests", "Requests sent to the vLLM replica, retries included.",
            ENDPOINT_LABELS, namespace=NAMESPACE, registry=registry,
        ),
        endpoint_errors=Counter(
            "upstream_endpoint_errors", "Failures of the vLLM replica, by reason: " + ", ".join(ENDPOINT_ERROR_REASONS)
            + ".", (*ENDPOINT_LABELS, "reason"), namespace=NAMESPACE, registry=registry,
        ),
        endpoint_ejections=Counter(
            "upstream_endpoint_ejections", "Times the vLLM replica was taken out of rotation.",
            ENDPOINT_LABELS, namespace=NAMESPACE, registry=registry,
        ),
        upstream_retries=Counter(
            "upstream_retries", "Requests sent to another replica after one refused the connection (nothing of the "
            "request had reached vLLM).", ("upstream",), namespace=NAMESPACE, registry=registry,
        ),
        feature_records=Counter(
            "feature_records", "Feature records by outcome and drift service (destination): queued, sent, "
            "dropped_full (its queue was full), dropped_send_error (refused for good with a 4xx, or still unsent "
            "when the gateway stopped). A batch the drift service could not take is retried, not dropped.",
            ("outcome", "destination"), namespace=NAMESPACE, registry=registry,
        ),
        feature_queue_depth=Gauge(
            "feature_queue_depth", "Feature records waiting to be sent, per drift service.", ("destination",),
            namespace=NAMESPACE, registry=registry,
        ),
        rating_deliveries=Counter(
            "rating_deliveries", "Ratings a drift service missed when the client's rating was taken by another "
            "(a drift pair), delivered later through its queue, by outcome as feature records.",
            ("outcome", "destination"), namespace=NAMESPACE, registry=registry,
        ),
        rating_queue_depth=Gauge(
            "rating_queue_depth", "Ratings waiting to reach a drift service that missed them.", ("destination",),
            namespace=NAMESPACE, registry=registry,
        ),
        delivery_failures=Counter(
            "delivery_failures", "Sends of a batch of feature records or ratings to a drift service that failed "
            "and will be retried, by kind and destination.", ("kind", "destination"), namespace=NAMESPACE,
            registry=registry,
        ),
        spans_dropped=Counter(
            "spans_dropped", "Sampled spans the gateway did not export: more than 2,048 waited for a slow trace "
            "collector, or the OTLP encoder refused them.", namespace=NAMESPACE, registry=registry,
        ),
        admission_rejected=Counter(
            "admission_rejected", "Requests answered 429 by admission control, by the limit that refused them: "
            "scope key or model; limit requests_per_minute, tokens_per_minute or in_flight.",
            ("model", "scope", "limit"), namespace=NAMESPACE, registry=registry,
        ),
        limits_reload_errors=Counter(
            "limits_reload_errors", "Times a changed limits file could not be read or parsed (the limits in force "
            "stay).", namespace=NAMESPACE, registry=registry,
        ),
        assignments=Counter(
            "assignments", "Requests assigned to a variant by an experiment's split, counted when routed (before "
            "the upstream answers, so failures cannot skew the sample ratio); forced variants are not counted.",
            ("model", "variant"), namespace=NAMESPACE, registry=registry,
        ),
        experiment_weight=Gauge(
            "experiment_weight_ratio", "The share of an experiment's traffic each variant is configured to get.",
            ("model", "experiment", "variant"), namespace=NAMESPACE, registry=registry,
        ),
        # GatewayUpstreamDown stands down for an upstream at 0: a rolled-back canary's vLLM may be
        # gone on purpose, and no user's request goes there
        upstream_weight=Gauge(
            "upstream_weight_ratio", "The largest share of an experiment's traffic any variant routed to the "
            "upstream gets (1 for the default upstream, which serves every model without an experiment); 0: only "
            "requests that force a variant reach it.",
            ("upstream",), namespace=NAMESPACE, registry=registry,
        ),
        # vLLM's series and the cost rules name the served model; this joins them to the public
        # model and the variant (alerts/cost.py)
        variant_served_model=Gauge(
            "variant_served_model_info", "1 for each variant of an experiment: the name its upstream serves the "
            "model under.", ("model", "variant", "served_model"), namespace=NAMESPACE, registry=registry,
        ),
        experiment_epoch=Gauge(
            "experiment_epoch", "The weight epoch this replica routes an experiment by (it grows with every weight "
            "change); replicas that share state through Redis agree on it within a second.",
            ("model", "experiment"), namespace=NAMESPACE, registry=registry,
        ),
        shared_state_up=Gauge(
            "shared_state_up", "1 while the shared state (Redis) answers; 0 from its first failure until it answers "
            "again (weights stay the last known, limits local, feedback local). Absent without "
            "INFERWATCH_GATEWAY_REDIS_URL.", namespace=NAMESPACE, registry=registry if shared_state else None,
        ),
        shared_state_errors=Counter(
            "shared_state_errors", "Operations on the shared state (Redis) that failed or ran past their timeout, by "
            "operation.", ("operation",), namespace=NAMESPACE, registry=registry if shared_state else None,
        ),
        feedback=Counter(
            "feedback", "User ratings of answers by outcome: positive (score >= 0.5), negative, or undelivered "
            "(the drift service did not take it; the client was told to retry).",
            ("model", "variant", "outcome"), namespace=NAMESPACE, registry=registry,
        ),
        build=Info("build", "Gateway version and configuration.", namespace=NAMESPACE, registry=registry),
        tenants=create_tenant_metrics(registry),
        adapters=create_adapter_metrics(registry),
    )


def observe_many(child: Histogram, values: list[float]) -> None:
    """``child.observe(v)`` for every value, as one update per bucket touched.

    A stream's inter-token gaps are hundreds of values, each a lock and a bucket search in
    ``observe``: most of what the gateway spent per token (bench/gateway_overhead.py). This
    writes the same counts straight into the child (prometheus_client keeps per-bucket,
    not cumulative, counts; pinned in pyproject.toml, checked against ``observe`` in tests)."""
    if not values:
        return
    bounds = child._upper_bounds
    tally = Tally(bisect_left(bounds, v) for v in values if not math.isnan(v))  # observe: the first bound >= v
    child._sum.inc(math.fsum(values))
    buckets = child._buckets
    for index, count in tally.items():
        buckets[index].inc(count)



class RouteSeries:
    """The request metrics' children for one (model, variant, route).

    ``labels()`` validates and locks on every call and costs more than the observation it
    leads to; the gateway records about ten series per request, so it looks them up once
    per label set (bounded: models are validated, variants configured, routes two)."""

    __slots__ = ("_abnormal", "_by_status", "_key", "_m", "_sampling", "in_flight", "input_tokens", "output_tokens",
                 "signals")

    def __init__(self, m: GatewayMetrics, model: str, variant: str, route: str) -> None:
        self._m, self._key = m, (model, variant, route)
        self._by_status: dict[str, tuple] = {}
        self.in_flight = m.in_flight.labels(model, variant)
        self.input_tokens = m.input_tokens.labels(model, variant, route)
        self.output_tokens = m.output_tokens.labels(model, variant, route)
        # each observed signal with its child, in declaration order
        self.signals: tuple[tuple[Signal, Histogram], ...] = tuple(
            (signal, m.signals[signal.name].labels(model, variant, route)) for signal in OBSERVED)
        self._abnormal = {kind: m.abnormal_outputs.labels(model, variant, route, kind) for kind in ABNORMAL_KINDS}
        self._sampling: dict[tuple[str, str], Counter] = {}

    def abnormal(self, kind: str) -> None:
        self._abnormal[kind].inc()

    def sampled(self, bins: SamplingBins) -> None:
        """One request's sampling parameters, binned."""
        children = self._sampling
        for key in zip(PARAMS, bins):
            child = children.get(key)
            if child is None:
                child = children[key] = self._m.sampling.labels(self._key[0], self._key[1], *key)
            child.inc()

    def answered_at_zero(self) -> None:
        """Make the status classes the SLOs read exist at 0 before any answer: ``rate()``
        needs a sample before the first failure to count it (a child created by its first 5xx
        starts at 1, and a model's first burst of failures would never reach its SLO)."""
        for status_class in STATUS_CLASSES:
            self.answered(status_class)

    def answered(self, status_class: str) -> tuple:
        """(requests counter, duration histogram) children for a status class."""
        pair = self._by_status.get(status_class)
        if pair is None:
            labels = (*self._key, status_class)
            pair = self._by_status[status_class] = (self._m.requests.labels(*labels),
                                                    self._m.request_duration.labels(*labels))
        return pair
