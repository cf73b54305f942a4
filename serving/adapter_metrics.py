"""The per-adapter metrics: the traffic of the LoRA adapters vLLM serves under names of their own.

Every other request metric counts an adapter's requests under its base model (``model``),
as vLLM's own counters do (their ``model_name`` is the base's): a base model's SLOs, cost per
token and tenants' spend take in its adapters' traffic without any join. These series keep
the adapter as a dimension of its own, beside its base, so its load, goodput and tokens (and
from them its cost, alerts/cost.py) can be told apart. Adapters are the ones vLLM lists
(/v1/models, ``parent`` set), so the series are bounded by what the operator loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from inferwatch.serving.errors import STATUS_CLASSES
from inferwatch.serving.tenant_metrics import NAMESPACE

ADAPTER_LABELS = ("model", "adapter")


@dataclass(frozen=True)
class AdapterMetrics:
    requests: Counter
    input_tokens: Counter
    output_tokens: Counter
    goodput_requests: Counter


def create_adapter_metrics(registry: CollectorRegistry) -> AdapterMetrics:
    def counter(name: str, doc: str, labels: tuple[str, ...] = ADAPTER_LABELS) -> Counter:
        return Counter(name, doc, labels, namespace=NAMESPACE, registry=registry)

    return AdapterMetrics(
        requests=counter("adapter_requests", "Requests to a LoRA adapter, by base model, adapter and status class "
                         "(also counted under the base model in inferwatch_gateway_requests_total).",
                         (*ADAPTER_LABELS, "status_class")),
        input_tokens=counter("adapter_input_tokens", "Prompt tokens of a LoRA adapter's requests, by base model and "
                             "adapter."),
        output_tokens=counter("adapter_output_tokens", "Generated tokens of a LoRA adapter's requests, by base model "
                              "and adapter."),
        goodput_requests=counter("adapter_goodput_requests", "A LoRA adapter's requests answered 2xx within every "
                                 "latency objective of its base model, by base model and adapter."),
    )


class AdapterSeries:
    """The children of one (base model, adapter), looked up once."""

    __slots__ = ("_key", "_requests", "by_status", "good", "input_tokens", "output_tokens")

    def __init__(self, m: AdapterMetrics, model: str, adapter: str) -> None:
        self._requests, self._key = m.requests, (model, adapter)
        self.by_status = {c: m.requests.labels(model, adapter, c) for c in STATUS_CLASSES}
        self.input_tokens = m.input_tokens.labels(model, adapter)
        self.output_tokens = m.output_tokens.labels(model, adapter)
        self.good = m.goodput_requests.labels(model, adapter)

    def answered(self, status_class: str) -> Counter:
        child = self.by_status.get(status_class)
        if child is None:
            child = self.by_status[status_class] = self._requests.labels(*self._key, status_class)
        return child
